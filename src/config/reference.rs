//! The configuration reference (`docs/configuration.md`, `hookrelay reference
//! config`), generated from the configuration types themselves: their JSON Schema
//! (schemars reads the doc comments, the types and the `Default` impls), walked into
//! one table per TOML section. A test fails when the committed file is stale, so the
//! reference cannot drift from the code.

use serde_json::{Map, Value};

use super::Config;

/// One key of a section.
struct Row {
    key: String,
    kind: String,
    default: String,
    meaning: String,
}

/// A section: `[ingress]`, `[[sources]]`, `[storage.postgres]`...
struct Section {
    title: String,
    description: String,
    rows: Vec<Row>,
}

/// The reference, as markdown.
pub(crate) fn reference() -> String {
    let schema = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or(Value::Null);
    let empty = Map::new();
    let defs = schema.get("$defs").and_then(Value::as_object).unwrap_or(&empty);
    let mut sections = Vec::new();
    walk(defs, "", false, &schema, None, &mut sections);
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of the TOML configuration (`config/hookrelay.toml` is a commented \
         example), generated from the configuration types (`hookrelay reference config > \
         docs/configuration.md`; a test fails when this file is stale). Unknown keys are \
         errors. Every key can also be set by an environment variable \
         `HOOKRELAY__SECTION__KEY` (double underscores; `HOOKRELAY__STORAGE__DATA_DIR`); \
         durations are written `500ms`, `30s`, `10m`, `1h`. A secret (`token`, `secret`, \
         `url` of PostgreSQL, ...) can instead be read from a file (`<key>_file`) or an \
         environment variable (`<key>_env`), and is never printed. `hookrelay \
         check-config` validates a file and prints it with every secret masked.\n",
    );
    for s in sections.into_iter().filter(|s| !s.rows.is_empty()) {
        out.push_str(&format!("\n## `{}`\n\n", s.title));
        if !s.description.is_empty() {
            out.push_str(&format!("{}\n\n", one_line(&s.description)));
        }
        out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        for r in s.rows {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                r.key,
                r.kind,
                r.default,
                one_line(&r.meaning).replace('|', "\\|")
            ));
        }
    }
    out
}

/// Doc comments are wrapped: one line for a table cell.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `schema` with its `$ref` followed, and whether it was optional (`Option<T>`).
fn resolve<'a>(defs: &'a Map<String, Value>, schema: &'a Value) -> (&'a Value, bool) {
    if let Some(target) = reference_of(defs, schema) {
        return (target, false);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let not_null: Vec<&Value> =
                options.iter().filter(|o| o.get("type") != Some(&Value::from("null"))).collect();
            if not_null.len() == 1 && options.len() == 2 {
                let (inner, _) = resolve(defs, not_null[0]);
                return (inner, true);
            }
        }
    }
    (schema, false)
}

fn reference_of<'a>(defs: &'a Map<String, Value>, schema: &Value) -> Option<&'a Value> {
    let name = schema.get("$ref")?.as_str()?.strip_prefix("#/$defs/")?;
    defs.get(name)
}

fn is_table(schema: &Value) -> bool {
    schema.get("properties").and_then(Value::as_object).is_some()
}

/// Adds the section of `schema` (an object) titled `title`, then its sub-sections.
fn walk(
    defs: &Map<String, Value>,
    title: &str,
    array: bool,
    schema: &Value,
    defaults: Option<&Value>,
    sections: &mut Vec<Section>,
) {
    let (schema, _) = resolve(defs, schema);
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let shown = if array { format!("[[{title}]]") } else { format!("[{title}]") };
    let mut here =
        Section { title: shown, description: text(schema, "description"), rows: Vec::new() };
    let mut below = Vec::new();
    for (name, prop) in properties {
        let (target, optional) = resolve(defs, prop);
        let default = prop.get("default").or_else(|| defaults.and_then(|d| d.get(name)));
        let path = if title.is_empty() { name.clone() } else { format!("{title}.{name}") };
        if is_table(target) {
            below.push((path, false, prop.clone(), default.cloned()));
            continue;
        }
        if let Some(items) = target.get("items") {
            let (item, _) = resolve(defs, items);
            if is_table(item) {
                below.push((path, true, items.clone(), None));
                continue;
            }
        }
        let meaning = match text(prop, "description") {
            m if m.is_empty() => text(target, "description"),
            m => m,
        };
        here.rows.push(Row {
            key: name.clone(),
            kind: kind(defs, target, optional),
            default: shown_default(default, target),
            meaning,
        });
    }
    sections.push(here);
    for (path, array, schema, default) in below {
        walk(defs, &path, array, &schema, default.as_ref(), sections);
    }
}

fn text(schema: &Value, key: &str) -> String {
    schema.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

/// A leaf's type in words.
fn kind(defs: &Map<String, Value>, schema: &Value, optional: bool) -> String {
    let base = if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(" \\| ")
    } else if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        // A documented enum: each variant a `const` with its description.
        let consts: Vec<String> = options
            .iter()
            .filter_map(|o| o.get("const").or_else(|| o.get("enum").and_then(|e| e.get(0))))
            .map(|v| format!("`{v}`"))
            .collect();
        if consts.is_empty() {
            "value".into()
        } else {
            consts.join(" \\| ")
        }
    } else {
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let nullable = types.contains(&"null");
        let main = types.iter().find(|t| **t != "null").copied().unwrap_or("value");
        let word = match (main, schema.get("format").and_then(Value::as_str)) {
            ("string", Some("secret")) => "secret".to_owned(),
            ("string", Some("duration")) => "duration".to_owned(),
            ("array", _) => match schema.get("items") {
                Some(items) => format!("list of {}", kind(defs, resolve(defs, items).0, false)),
                None => "list".to_owned(),
            },
            ("object", _) => "table of strings".to_owned(),
            ("number", _) => "number".to_owned(),
            (other, _) => other.to_owned(),
        };
        return if optional || nullable { format!("{word}, optional") } else { word };
    };
    if optional {
        format!("{base}, optional")
    } else {
        base
    }
}

/// A default as TOML would write it; `—` for none.
fn shown_default(default: Option<&Value>, schema: &Value) -> String {
    match default {
        None | Some(Value::Null) => "—".into(),
        Some(Value::String(s))
            if schema.get("format").and_then(Value::as_str) == Some("secret") =>
        {
            format!("`{s:?}`")
        }
        Some(Value::Array(a)) if a.is_empty() => "`[]`".into(),
        Some(Value::Object(o)) if o.is_empty() => "`{}`".into(),
        Some(v) => format!("`{v}`"),
    }
}

#[cfg(test)]
mod tests {
    /// The committed reference is the one the code gives (regenerate with
    /// `cargo run -- reference config > docs/configuration.md`).
    #[test]
    fn the_committed_configuration_reference_is_up_to_date() {
        let committed =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md"))
                .unwrap_or_default();
        assert!(
            committed == super::reference(),
            "docs/configuration.md is stale: run `cargo run -- reference config > docs/configuration.md`"
        );
    }

    /// Every key says what it is for (a doc comment on its field).
    #[test]
    fn every_key_has_a_meaning() {
        let reference = super::reference();
        let bare: Vec<&str> = reference.lines().filter(|l| l.ends_with("|  |")).collect();
        assert!(bare.is_empty(), "keys without a doc comment: {bare:#?}");
    }

    /// Every key the shipped example sets is in the reference (a key renamed in the
    /// types and not in the file, or the other way round, shows here).
    #[test]
    fn the_reference_names_every_key_of_the_shipped_config() {
        let reference = super::reference();
        let shipped: toml::Table = toml::from_str(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/hookrelay.toml"))
                .unwrap(),
        )
        .unwrap();
        for (section, value) in &shipped {
            let tables: Vec<&toml::Table> = match value {
                toml::Value::Table(t) => vec![t],
                toml::Value::Array(a) => a.iter().filter_map(toml::Value::as_table).collect(),
                _ => continue,
            };
            assert!(reference.contains(&format!("{section}]")), "section {section}");
            for t in tables {
                for (key, value) in t {
                    if value.is_table() {
                        assert!(
                            reference.contains(&format!("{section}.{key}]`")),
                            "{section}.{key}"
                        );
                        continue;
                    }
                    assert!(reference.contains(&format!("| `{key}` |")), "{section}.{key}");
                }
            }
        }
    }
}
