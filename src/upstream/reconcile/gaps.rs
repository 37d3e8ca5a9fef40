//! The gap lifecycle of a Disabled hook: the gap stored before the hook is deleted,
//! the hook re-created, the gap closed and its `hookrelay.HookGap` event stored, the
//! gap forgotten (see `upstream/gap.rs` for why in that order).

use super::*;

impl Reconciler {
    /// Delete-then-create of the Disabled `old` hooks for `event`, with the gap stored
    /// first and reported once the new hook exists.
    pub(super) async fn recreate(
        &self,
        account: &Account,
        event: &str,
        old: &[Hook],
        earlier: Option<PendingGap>,
        progress: &mut Progress,
    ) -> Result<(), UpstreamError> {
        for hook in old {
            if hook.status == "Disabled" && lock(&self.seen_disabled).insert(hook.id.clone()) {
                self.gauges.transition(account.id(), event, "Active", "Disabled");
            }
        }
        let gap = PendingGap::from_hooks(old, earlier, crate::clock::now());
        self.save_gap(account, event, Some(&gap)).await?;
        let ids: Vec<String> = old.iter().map(|h| h.id.clone()).collect();
        account.client.delete(&ids).await?;
        progress.ours.retain(|h| !ids.contains(&h.id));
        let new = account.client.create(event, &account.target(event)).await?;
        HookRecreated {
            account: account.id(),
            event,
            old: &ids,
            new: &new.id,
            window_start: gap.window_start.as_deref(),
        }
        .emit(&self.gauges.metrics);
        self.gauges.track_created(account.id(), event, &new.id);
        self.report_gap(account, event, gap.close(&new.id, crate::clock::now())).await?;
        progress.changes.push(Change {
            action: "recreated".into(),
            event: event.to_owned(),
            hook_id: new.id.clone(),
            replaced: ids,
        });
        progress.ours.push(new);
        Ok(())
    }

    /// Stores the closed gap, then its `HookGap` event, then forgets the gap: each
    /// step durable before the next, so a crash anywhere raises the same event again
    /// (see `gap.rs`), never a different one.
    pub(super) async fn report_gap(
        &self,
        account: &Account,
        event: &str,
        gap: PendingGap,
    ) -> Result<(), UpstreamError> {
        let Some(closed) = gap.closed.clone() else {
            return Err(UpstreamError::Store("a hook gap reported before it was closed".into()));
        };
        self.save_gap(account, event, Some(&gap)).await?;
        let new_event = gap::event(account.id(), event, &gap, &closed, crate::clock::now());
        let stored =
            self.store.append(new_event).await.map_err(|e| UpstreamError::Store(e.to_string()))?;
        tracing::info!(id = %stored, source = %account.id().source, account = %account.id().account, event, "HookGap event stored");
        // Shown by `GET /admin/hooks` until the next gap of the event; a crash before
        // this raises the same event again, and this is written then.
        if let Some(view) = gap.view(event, stored) {
            let bytes =
                serde_json::to_vec(&view).map_err(|e| UpstreamError::Store(e.to_string()))?;
            let key = gap::last_key(account.id(), event);
            self.store
                .upstream_put(&key, Some(bytes))
                .await
                .map_err(|e| UpstreamError::Store(e.to_string()))?;
        }
        self.save_gap(account, event, None).await
    }

    pub(super) async fn save_gap(
        &self,
        account: &Account,
        event: &str,
        gap: Option<&PendingGap>,
    ) -> Result<(), UpstreamError> {
        let key = PendingGap::key(account.id(), event);
        let value = gap
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| UpstreamError::Store(e.to_string()))?;
        self.store.upstream_put(&key, value).await.map_err(|e| UpstreamError::Store(e.to_string()))
    }

    pub(super) async fn pending_gaps(&self, account: &Account) -> HashMap<String, PendingGap> {
        let prefix = PendingGap::prefix(account.id());
        let metrics = &self.gauges.metrics;
        let entries = match self.store.upstream_scan(&prefix).await {
            Ok(entries) => entries,
            Err(e) => {
                ReconcilerStoreFailed {
                    what: "cannot read pending hook gaps: their HookGap events wait for the next pass",
                    account: Some(account.id()),
                    error: &e,
                }
                .emit(metrics);
                return HashMap::new();
            }
        };
        entries
            .into_iter()
            .filter_map(|(key, value)| {
                let event = key.strip_prefix(&prefix)?.to_owned();
                match serde_json::from_slice(&value) {
                    Ok(gap) => Some((event, gap)),
                    Err(e) => {
                        StoredGapUnreadable { key: &key, error: &e }.emit(metrics);
                        None
                    }
                }
            })
            .collect()
    }
}
