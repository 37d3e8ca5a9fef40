//! Human-friendly durations in the config file (`"500ms"`, `"10m"`, `"1h 30m"`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses `"500ms"`, `"10m"`, `"0"`; a bare integer is taken as seconds, so that an
/// environment override such as `HOOKRELAY__SHUTDOWN__GRACE=5` does what it says.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (expected a duration such as \"500ms\", \"30s\", \"10m\")"))
}

/// Serde `deserialize_with` helper for [`Duration`] fields.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(secs) => Ok(Duration::from_secs(secs)),
        Raw::Text(text) => parse(&text).map_err(serde::de::Error::custom),
    }
}

/// Serde `serialize_with` helper: writes the same form the parser reads.
pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&text(*d))
}

/// `d` as the configuration writes it: whole days from a month up as days (`400d`:
/// humantime would say `1year 1month 4days 7h 26m 24s`, its year and month being
/// averages), anything else as humantime writes it.
pub(crate) fn text(d: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    if d.subsec_nanos() == 0 && d.as_secs() >= 30 * DAY && d.as_secs().is_multiple_of(DAY) {
        return format!("{}d", d.as_secs() / DAY);
    }
    humantime::format_duration(d).to_string()
}

/// The same for `Option<Duration>` fields (absent means `None`).
pub(crate) mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(deserialize_with = "super::deserialize")] Duration);
        Option::<Wrap>::deserialize(d).map(|w| w.map(|w| w.0))
    }

    pub(crate) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}

/// A duration as the configuration writes it (`"30s"`), for the configuration
/// reference's schema (`#[schemars(with = "Text")]` on a duration field).
pub(crate) struct Text;

impl schemars::JsonSchema for Text {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "duration" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("15"), Ok(Duration::from_secs(15)));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        let err = parse("ten minutes").unwrap_err();
        assert!(err.contains("expected a duration"), "{err}");
    }

    #[test]
    fn round_trips_through_its_own_format() {
        for d in [
            Duration::from_millis(90_500),
            Duration::from_secs(400 * 24 * 3600),
            Duration::from_secs(30 * 24 * 3600 + 1),
            Duration::from_secs(7 * 24 * 3600),
        ] {
            assert_eq!(parse(&text(d)), Ok(d), "{}", text(d));
        }
        assert_eq!(text(Duration::from_secs(400 * 24 * 3600)), "400d");
    }
}
