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
    KNOWN.iter().find(|k| **k == name).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

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
