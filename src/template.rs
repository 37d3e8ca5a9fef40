//! Names made of an event's parts: a broker destination's subject, routing key or
//! stream, written as `hookrelay.{source}.{event}`. Parsed once when the configuration
//! is checked (an unknown placeholder is an error there), rendered per delivery.
//!
//! A placeholder's value comes from the callback (its event name, its source, the
//! type of the resource its body is about), so it is cleaned before it joins a name:
//! every character outside `A-Z a-z 0-9 _ -` becomes `_`, and an empty or missing
//! value is `none`. A value can then never add a NATS subject token (`.`), a wildcard
//! (`*`, `>`) or a space, whatever the upstream sends.

/// The placeholders a template may use.
pub(crate) const PLACEHOLDERS: [&str; 3] = ["{event}", "{source}", "{resource_type}"];

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Event,
    Source,
    ResourceType,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

/// What a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Values<'a> {
    pub(crate) event: &'a str,
    pub(crate) source: &'a str,
    /// The resource's type (`actions` of `actions/5`), when the body names one.
    pub(crate) resource_type: Option<&'a str>,
}

impl Template {
    /// Parses `text`; the error says what is wrong and what may be used.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(format!("{text:?}: a `{{` without its `}}`"));
            };
            let name = &rest[open..open + close + 1];
            parts.push(match name {
                "{event}" => Part::Event,
                "{source}" => Part::Source,
                "{resource_type}" => Part::ResourceType,
                other => {
                    return Err(format!(
                        "{text:?}: unknown placeholder {other}; use {}",
                        PLACEHOLDERS.join(", ")
                    ))
                }
            });
            rest = &rest[open + close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("{text:?}: a `}}` without its `{{`"));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err("is empty".into());
        }
        Ok(Self { parts })
    }

    /// The template's fixed text, placeholders left out (for a kind's own checks of
    /// the characters it allows).
    pub(crate) fn literal(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The name for `values`, each value cleaned (see the module's doc).
    pub(crate) fn render(&self, values: &Values<'_>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Event => clean_into(&mut out, Some(values.event)),
                Part::Source => clean_into(&mut out, Some(values.source)),
                Part::ResourceType => clean_into(&mut out, values.resource_type),
            }
        }
        out
    }
}

/// Appends `value` with every character outside `A-Z a-z 0-9 _ -` made `_`; `none`
/// for an empty or missing one.
fn clean_into(out: &mut String, value: Option<&str>) {
    match value.filter(|v| !v.is_empty()) {
        None => out.push_str("none"),
        Some(v) => out.extend(v.chars().map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })),
    }
}

/// The type of a resource named `type/id` (`actions/5` → `actions`).
pub(crate) fn resource_type(resource: Option<&str>) -> Option<&str> {
    resource.map(|r| r.split_once('/').map_or(r, |(t, _)| t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values<'a>(event: &'a str, source: &'a str, rt: Option<&'a str>) -> Values<'a> {
        Values { event, source, resource_type: rt }
    }

    #[test]
    fn placeholders_are_replaced_and_text_kept() {
        let t = Template::parse("hookrelay.{source}.{event}.{resource_type}").unwrap();
        let v = values("ActionCreated", "demo", Some("actions"));
        assert_eq!(t.render(&v), "hookrelay.demo.ActionCreated.actions");
        assert_eq!(t.render(&values("A", "s", None)), "hookrelay.s.A.none");
        assert_eq!(t.literal(), "hookrelay...");
        assert_eq!(Template::parse("fixed").unwrap().render(&v), "fixed");
        assert_eq!(Template::parse("{event}").unwrap().render(&v), "ActionCreated");
    }

    #[test]
    fn a_wrong_template_says_why() {
        assert!(Template::parse("a.{evnt}").unwrap_err().contains("unknown placeholder {evnt}"));
        assert!(Template::parse("a.{event").unwrap_err().contains("without its"));
        assert!(Template::parse("a.event}").unwrap_err().contains("without its"));
        assert_eq!(Template::parse("").unwrap_err(), "is empty");
    }

    #[test]
    fn resource_types_are_the_part_before_the_slash() {
        assert_eq!(resource_type(Some("actions/5")), Some("actions"));
        assert_eq!(resource_type(Some("odd")), Some("odd"));
        assert_eq!(resource_type(None), None);
    }

    proptest! {
        /// Whatever a callback carries, a placeholder's value adds no separator,
        /// wildcard or space, and is never empty.
        #[test]
        fn values_from_a_callback_stay_one_clean_token(event in ".{0,40}", source in ".{0,10}") {
            let t = Template::parse("{event}").unwrap();
            let out = t.render(&values(&event, &source, None));
            prop_assert!(!out.is_empty());
            prop_assert!(out.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'), "{out:?}");
        }
    }
}
