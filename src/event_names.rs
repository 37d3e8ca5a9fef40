//! The upstream's event names, the only values the `event` metric label takes.

/// The 21 events the upstream raises (`upstream-api.md`, "Events").
pub(crate) const KNOWN: [&str; 21] = [
    "ActionCreated",
    "ActionUpdated",
    "ActionDocumentCreated",
    "ActionDocumentUpdated",
    "ActionDocumentDeleted",
    "ActionParticipantAdded",
    "ActionParticipantDeleted",
    "DataCollectionRecordUpdated",
    "DataCollectionRecordDeleted",
    "DataCollectionRecordValueUpdated",
    "DisbursementCreated",
    "DisbursementUpdated",
    "FileNoteCreated",
    "FileNoteUpdated",
    "ParticipantCreated",
    "ParticipantUpdated",
    "StepChanged",
    "TaskCreated",
    "TaskUpdated",
    "TimeEntryCreated",
    "TimeEntryUpdated",
];

/// Raised by the relay itself when a Disabled hook was re-created: callbacks between
/// its last trigger and its re-creation were lost upstream (see `upstream/gap.rs`).
pub(crate) const HOOK_GAP: &str = "hookrelay.HookGap";

/// The names of the relay's own operational events (`operational.rs`), in the order of
/// its `OperationalEvent` variants.
pub(crate) const OPERATIONAL: &[&str] = &[
    "hookrelay.DeliveryDead",
    "hookrelay.CircuitOpened",
    "hookrelay.CircuitClosed",
    "hookrelay.DestinationPaused",
    "hookrelay.DestinationStalled",
    "hookrelay.StorageLow",
    "hookrelay.ProgramDisabled",
    "hookrelay.AdminAction",
];

/// The known name nearest to a mistyped `name` (case-insensitively, by edit distance,
/// at most a third of its length away), for an error message to suggest.
pub(crate) fn closest(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    let distance = |known: &str| -> usize {
        let (a, b): (Vec<char>, Vec<char>) =
            (name.chars().collect(), known.to_ascii_lowercase().chars().collect());
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.iter().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    KNOWN
        .iter()
        .map(|k| (distance(k), *k))
        .min()
        .filter(|(d, _)| *d <= name.len().div_ceil(3))
        .map(|(_, k)| k)
}

/// Whether `name`, from a callback's path or body, is a plausible event name:
/// `[A-Za-z0-9_.-]`, 1 to 128 bytes, with at least one letter (so not `..`). Both are
/// arbitrary input and a name ends up in a delivery header, a log line and a database
/// row: anything else (a control character, a NUL) is not taken as the name, and the
/// event is stored under the other source's name or `unknown`; never refused.
pub(crate) fn is_plausible(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name.bytes().any(|b| b.is_ascii_alphabetic())
}

/// Names the relay reserves for its own events; only explicit `hookrelay.*` routes
/// take them, and no callback can claim one.
pub(crate) fn is_internal(name: &str) -> bool {
    name.starts_with("hookrelay.")
}

/// Label value for the event name: itself when known, `other` otherwise, so a caller
/// cannot create unbounded label values.
pub(crate) fn metric_label(name: &str) -> &'static str {
    if name == HOOK_GAP {
        return HOOK_GAP;
    }
    if let Some(own) = OPERATIONAL.iter().find(|n| **n == name) {
        return own;
    }
    KNOWN.iter().find(|k| **k == name).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mistyped_name_gets_the_nearest_known_one() {
        assert_eq!(closest("ActionCreate"), Some("ActionCreated"));
        assert_eq!(closest("actioncreated"), Some("ActionCreated"));
        assert_eq!(closest("FileNoteUpdate"), Some("FileNoteUpdated"));
        assert_eq!(closest("Banana"), None);
    }

    #[test]
    fn only_plain_names_are_event_names() {
        for good in ["ActionCreated", "hookrelay.HookGap", "a-b_c.9"] {
            assert!(is_plausible(good), "{good}");
        }
        let long = "A".repeat(129);
        for bad in [
            "",
            "a b",
            "..",
            ".",
            "-_.9",
            &long,
            "Action\nCreated",
            "Action\0",
            "Actión",
            "a\u{7f}",
        ] {
            assert!(!is_plausible(bad), "{bad:?}");
        }
    }

    #[test]
    fn labels_are_bounded() {
        assert_eq!(metric_label("ActionCreated"), "ActionCreated");
        assert_eq!(metric_label("TimeEntryUpdated"), "TimeEntryUpdated");
        assert_eq!(metric_label("actioncreated"), "other");
        assert_eq!(metric_label("unknown"), "other");
        assert_eq!(metric_label(&"x".repeat(500)), "other");
        assert_eq!(metric_label(HOOK_GAP), HOOK_GAP);
        assert_eq!(metric_label("hookrelay.Other"), "other");
    }
}
