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

/// Label value for the event name: itself when known, `other` otherwise, so a caller
/// cannot create unbounded label values.
pub(crate) fn metric_label(name: &str) -> &'static str {
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
    }
}
