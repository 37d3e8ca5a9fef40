//! The documentation as a newcomer meets it: a README that fits on a screen or two,
//! and no link, in it or under docs/, to a file that is not there.

use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The relative link targets of a markdown text (`[x](target)`), anchors dropped;
/// code spans (between backticks) are not links.
fn links(text: &str) -> Vec<String> {
    let prose: String = text
        .lines()
        .map(|l| l.split('`').step_by(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with('#') && !target.starts_with("mailto:") {
            out.push(target.split('#').next().unwrap_or("").to_owned());
        }
    }
    out
}

#[test]
fn the_readme_fits_on_a_screen_or_two_and_every_link_resolves() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: move detail to docs/ (at most 250)");
    let mut files =
        vec![Path::new(ROOT).join("README.md"), Path::new(ROOT).join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let dir = file.parent().unwrap();
        for target in links(&text) {
            if !target.is_empty() && !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}

/// Every file under the project's own folders, as paths relative to the root.
fn project_paths() -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let root = Path::new(ROOT);
    let mut out = Vec::new();
    for top in ["src", "tests", "docs", "deploy", "benches", "config", "scripts", ".ci"] {
        walk(root, &root.join(top), &mut out);
    }
    for entry in std::fs::read_dir(root).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        out.push(if entry.path().is_dir() { format!("{name}/") } else { name });
    }
    out
}

/// Every identifier in the relay's Rust sources (src/).
fn identifiers() -> std::collections::HashSet<String> {
    let mut words = std::collections::HashSet::new();
    for path in project_paths().iter().filter(|p| p.starts_with("src/") && p.ends_with(".rs")) {
        let text = std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_default();
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !word.is_empty() {
                words.insert(word.to_owned());
            }
        }
    }
    words
}

/// Names that ARCHITECTURE.md may use that are not the project's: a header, SQL, std.
const NOT_OURS: &[&str] = &["Allow", "LISTEN", "NOTIFY", "BTreeMap", "HashMap", "Arc", "Weak"];

/// What `text` names in code spans that is not in the project: paths (a span ending
/// in a known extension or `/`) that are no file's or folder's path or the end of one,
/// and Rust items (`Type` or `Type::member`) whose names no source has.
fn unknown_names(
    text: &str,
    paths: &[String],
    words: &std::collections::HashSet<String>,
) -> Vec<String> {
    let alerts =
        std::fs::read_to_string(Path::new(ROOT).join("deploy/prometheus/alerts.yml")).unwrap();
    let mut unknown = Vec::new();
    for span in text.split('`').skip(1).step_by(2) {
        if span.contains(char::is_whitespace) || span.is_empty() {
            continue;
        }
        let is_path = [".rs", ".md", ".toml", ".yml", ".yaml", ".sh", ".json"]
            .iter()
            .any(|e| span.ends_with(e))
            || span.ends_with('/');
        if is_path {
            // URL paths, runtime directories and templates are not the project's files.
            if span.starts_with(['/', '.', '{']) || span.contains('{') {
                continue;
            }
            if !paths.iter().any(|p| p == span || p.ends_with(&format!("/{span}"))) {
                unknown.push(span.to_owned());
            }
            continue;
        }
        let item = span.trim_end_matches("()");
        let mut parts = item.split("::");
        let Some(first) = parts.next() else { continue };
        let is_item = first.starts_with(|c: char| c.is_ascii_uppercase())
            && first.chars().any(|c| c.is_ascii_lowercase())
            && item.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if !is_item || NOT_OURS.contains(&first) {
            continue;
        }
        if first.starts_with("Hookrelay") {
            if !alerts.contains(&format!("alert: {first}")) {
                unknown.push(span.to_owned());
            }
            continue;
        }
        if !std::iter::once(first).chain(parts).all(|w| words.contains(w)) {
            unknown.push(span.to_owned());
        }
    }
    unknown.sort();
    unknown.dedup();
    unknown
}

/// ARCHITECTURE.md names only what is there: every file or folder path and every Rust
/// type and member in its code spans exists (and the check finds what does not).
#[test]
fn architecture_md_names_only_paths_and_items_that_exist() {
    let (paths, words) = (project_paths(), identifiers());
    let page = std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let unknown = unknown_names(&page, &paths, &words);
    assert!(unknown.is_empty(), "ARCHITECTURE.md names what is not there: {unknown:#?}");
    let doctored = "`store/nowhere.rs`, `engine/current.rs`, `Space::admit`, `Nowhere::thing`, `Space::nothing_of_that_name`";
    assert_eq!(
        unknown_names(doctored, &paths, &words),
        vec!["Nowhere::thing", "Space::nothing_of_that_name", "store/nowhere.rs"],
    );
}
