//! How deeply a JSON text nests, told without parsing it.
//!
//! jq (jaq) parses and walks a value recursively: a body of 200,000 `[` is a stack
//! overflow, whatever thread it runs on. So a body reaches a program only when it
//! nests no deeper than [`MAX_DEPTH`]; deeper, the program sees `body` as null, with
//! the reason in a filter's (`shape::filter_verdict`). The bound is serde_json's for a
//! `Value`, which the relay's own readings of a body (dedup keys, the admin views)
//! keep: a body deeper than it is no JSON value to them either.

/// The deepest nesting of arrays and objects a program is given.
pub(crate) const MAX_DEPTH: usize = 127;

/// Whether `text` opens more than `max` arrays or objects inside one another. Brackets
/// inside strings do not count; the text need not be valid JSON (an unclosed bracket
/// still counts as open). One pass, no allocation.
pub(crate) fn nests_deeper_than(text: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_brackets_outside_strings_only() {
        assert!(!nests_deeper_than(br#"{"a":[1,{"b":[]}]}"#, 4));
        assert!(nests_deeper_than(br#"{"a":[1,{"b":[]}]}"#, 3));
        assert!(!nests_deeper_than(br#"{"a":"[[[[[[[[[[\"[[[["}"#, 1));
        assert!(nests_deeper_than(br#"{"a":"\\"}[[["#, 2), "an escaped backslash ends");
        let deep = format!("{{\"data\":{}{}}}", "[".repeat(200_000), "]".repeat(200_000));
        assert!(nests_deeper_than(deep.as_bytes(), MAX_DEPTH));
    }

    proptest! {
        /// Exactly serde_json's own limit for a `Value`: what it parses is never too
        /// deep, and what is too deep it refuses.
        #[test]
        fn agrees_with_serde_json(depth in 1usize..300, object in any::<bool>()) {
            let (open, close) = if object { ("{\"k\":", "}") } else { ("[", "]") };
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let parsed = serde_json::from_str::<serde_json::Value>(&text).is_ok();
            prop_assert_eq!(nests_deeper_than(text.as_bytes(), MAX_DEPTH), !parsed);
        }
    }
}
