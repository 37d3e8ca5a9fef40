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
