//! The house's shape, checked: every room of `src/` imports only rooms of a lower
//! layer, as the `layers` block of ARCHITECTURE.md declares them, and no two folders
//! that do not hold one another import each other. A new room must be placed in the
//! block; an import that runs back up, or a circle, fails here with the file that
//! makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The layers as ARCHITECTURE.md declares them (the fenced block tagged `layers`):
/// each line one layer, lowest first, `label: room room ...`.
fn declared_layers(page: &str) -> Vec<Vec<String>> {
    let start = page.find("```layers\n").expect("ARCHITECTURE.md has a ```layers block");
    let body = &page[start + "```layers\n".len()..];
    let body = &body[..body.find("```").expect("the layers block ends")];
    body.lines()
        .map(|l| l.split_once(':').map_or(l, |(_, rooms)| rooms))
        .map(|rooms| rooms.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter(|rooms| !rooms.is_empty())
        .collect()
}

/// Every `.rs` file under `src/`, as (path from `src/`, text).
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    let src = Path::new(ROOT).join("src");
    walk(&src, &src, &mut out);
    out.sort();
    out
}

/// `text` without its comments (doc comments name rooms they do not import).
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The module paths `text` names from `head` (`crate`, `super`, `self`): the words
/// after each `head::`, as far as the path goes.
fn paths<'t>(text: &'t str, head: &str) -> Vec<Vec<&'t str>> {
    let needle = format!("{head}::");
    let mut out = Vec::new();
    for (at, _) in text.match_indices(&needle) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &text[at + needle.len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let words: Vec<&str> = rest[..end].split("::").filter(|w| !w.is_empty()).collect();
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

/// The room of a file: its first folder, or its own name for a file of `src/`.
fn room(rel: &str) -> &str {
    let first = rel.split('/').next().unwrap_or(rel);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// Every import that runs back up (or sideways within a layer), and every room that
/// is not placed, or placed and gone.
fn layer_violations(layers: &[Vec<String>], files: &[(String, String)]) -> Vec<String> {
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, rooms)| rooms.iter().map(move |r| (r.as_str(), i)))
        .collect();
    let mut problems = Vec::new();
    let rooms: BTreeSet<&str> =
        files.iter().map(|(rel, _)| room(rel)).filter(|r| !matches!(*r, "lib" | "main")).collect();
    for r in &rooms {
        if !layer_of.contains_key(r) {
            problems.push(format!("room `{r}` is in no layer of ARCHITECTURE.md's layers block"));
        }
    }
    for r in layer_of.keys() {
        if !rooms.contains(r) {
            problems.push(format!("the layers block names `{r}`, which src/ does not hold"));
        }
    }
    for (rel, text) in files {
        let from = room(rel);
        let Some(&from_layer) = layer_of.get(from) else { continue };
        let mut seen = BTreeSet::new();
        for path in paths(&code(text), "crate") {
            let to = path[0];
            if to == from || !seen.insert(to) {
                continue;
            }
            match layer_of.get(to) {
                Some(&to_layer) if to_layer < from_layer => {}
                Some(&to_layer) => problems.push(format!(
                    "src/{rel}: `{from}` (layer {}) imports `{to}` (layer {}): only lower \
                     layers may be imported",
                    from_layer + 1,
                    to_layer + 1
                )),
                None => {}
            }
        }
    }
    problems
}

/// A file's module path (`store/embedded/engine/mod.rs` → store, embedded, engine).
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> =
        rel.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The folder a module path lands in: the deepest folder of `src/` it names.
fn folder_of(path: &[String], folders: &BTreeSet<String>) -> String {
    (1..=path.len())
        .rev()
        .map(|k| path[..k].join("/"))
        .find(|f| folders.contains(f))
        .unwrap_or_else(|| path.first().cloned().unwrap_or_default())
}

/// Pairs of folders, neither inside the other, that import each other (through
/// `crate::`, `super::` or `self::` paths).
fn circles(files: &[(String, String)]) -> Vec<String> {
    let folders: BTreeSet<String> = files
        .iter()
        .flat_map(|(rel, _)| {
            let parts: Vec<&str> = rel.split('/').collect();
            (1..parts.len()).map(move |k| parts[..k].join("/")).collect::<Vec<_>>()
        })
        .collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (rel, text) in files {
        let me = module_of(rel);
        let from = folder_of(&me, &folders);
        let text = code(text);
        for head in ["crate", "super", "self"] {
            for path in paths(&text, head) {
                let mut base: Vec<String> = match head {
                    "crate" => Vec::new(),
                    "self" => me.clone(),
                    _ => me[..me.len().saturating_sub(1)].to_vec(),
                };
                let mut words = path.as_slice();
                while let Some((&"super", rest)) = words.split_first() {
                    base.pop();
                    words = rest;
                }
                base.extend(words.iter().map(|w| (*w).to_owned()));
                let to = folder_of(&base, &folders);
                if !to.is_empty() && to != from {
                    edges.entry(from.clone()).or_default().entry(to).or_insert_with(|| rel.clone());
                }
            }
        }
    }
    let nested =
        |a: &str, b: &str| a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"));
    let mut out = Vec::new();
    for (a, tos) in &edges {
        for (b, by) in tos {
            if a < b && !nested(a, b) {
                if let Some(back) = edges.get(b).and_then(|t| t.get(a)) {
                    out.push(format!("{a} and {b} import each other (src/{by}, src/{back})"));
                }
            }
        }
    }
    out
}

#[test]
fn every_room_imports_only_lower_layers_and_no_two_folders_form_a_circle() {
    let page = std::fs::read_to_string(Path::new(ROOT).join("ARCHITECTURE.md")).unwrap();
    let layers = declared_layers(&page);
    assert!(layers.len() >= 5, "the layers block declares {} layers: {layers:?}", layers.len());
    let files = sources();
    let mut problems = layer_violations(&layers, &files);
    problems.extend(circles(&files));
    assert!(problems.is_empty(), "the house's shape is broken:\n{}", problems.join("\n"));
}

/// The checks find what they look for: an import back up, a room not placed, a circle.
#[test]
fn the_layer_check_finds_an_import_back_up_an_unplaced_room_and_a_circle() {
    let layers = vec![vec!["clock".to_owned()], vec!["store".to_owned(), "config".to_owned()]];
    let file = |rel: &str, text: &str| (rel.to_owned(), text.to_owned());
    let files = vec![
        file("clock.rs", "use crate::store::EventId; // crate::config in a comment\n"),
        file("store/mod.rs", "use crate::clock::now;\nuse crate::config::X;\n"),
        file("config/mod.rs", "/// crate::store\nfn f() {}\n"),
        file("extra.rs", "fn g() {}\n"),
    ];
    let found = layer_violations(&layers, &files);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].contains("room `extra`"), "{found:#?}");
    assert!(found[1].starts_with("src/clock.rs: `clock` (layer 1) imports `store`"), "{found:#?}");
    assert!(found[2].starts_with("src/store/mod.rs: `store` (layer 2) imports `config`"));
    let knot = vec![
        file("store/embedded/a.rs", "use super::super::conformance::x;\n"),
        file("store/conformance/b.rs", "use crate::store::embedded::y;\n"),
        file("store/mod.rs", "use self::embedded::z;\n"),
    ];
    let found = circles(&knot);
    assert_eq!(found, vec!["store/conformance and store/embedded import each other (src/store/conformance/b.rs, src/store/embedded/a.rs)"]);
}
