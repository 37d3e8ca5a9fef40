//! `hookrelay migrate --to redb` (or `--to sled`): the embedded store copied, tree by
//! tree and byte for byte, from one engine to the other in the same data directory.
//!
//! Both engines hold one layout (the trees of `mod.rs`, the same keys and values), so
//! a copy is the whole migration. It is safe to stop at any point: the copy is built
//! beside the data (`.migrate-{engine}/`), checked entry by entry against the source,
//! made durable, and only then switched to, in one rename (the `CURRENT` file,
//! `engine/current.rs`): before it the source is the current store and the relay
//! starts on it as before; after it the copy is, and a crash while its files are
//! moved into place is finished by the next open. The relay must be stopped (each
//! engine locks its database to one process, which the copy also opens).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::engine::current::{self, finish_switch, staging, switch_to};
use super::engine::{files_of, Batch, Db, Engine, EngineOptions, Tree};
use super::{SCHEMA_KEY, SCHEMA_VERSION, TREES};
use crate::store::StoreError;

/// Entries written per batch: bounded memory whatever the store holds.
const BATCH: usize = 2048;

/// What a copy did, to print.
#[derive(Debug)]
pub(crate) struct CopyReport {
    pub(crate) entries: u64,
    pub(crate) bytes: u64,
    pub(crate) from: Engine,
    pub(crate) to: Engine,
    /// What is left of the source, to remove once the relay runs on the copy.
    pub(crate) leftovers: Vec<PathBuf>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| StoreError::Backend { backend: "migrate", message: format!("{what}: {e}") }
}

fn refuse(message: String) -> StoreError {
    StoreError::Config(message)
}

/// Copies the `from` store in `dir` to a new `to` store in `dir`. Blocking.
pub(crate) fn copy(
    from: Engine,
    to: Engine,
    dir: &Path,
    cache_capacity_bytes: u64,
    compression: bool,
) -> Result<CopyReport, StoreError> {
    if from == to {
        return Err(refuse(format!(
            "storage.backend is {} already: nothing to migrate (--to names the engine to move to)",
            to.name()
        )));
    }
    // A switch a crash cut short is finished before anything else is decided.
    finish_switch(dir)?;
    if current::current(dir)? == Some(to) {
        return Err(refuse(format!(
            "{} already holds a {} database, the current one (its {} file says so: a              migration to {} finished): set storage.backend = \"{}\" or leave it unset",
            dir.display(),
            to.name(),
            current::CURRENT,
            to.name(),
            to.name()
        )));
    }
    if files_of(from, dir).is_empty() {
        return Err(refuse(format!(
            "no {} database in {}: check storage.data_dir and storage.backend (the engine \
             the data is in now)",
            from.name(),
            dir.display()
        )));
    }
    let existing = files_of(to, dir);
    if !existing.is_empty() {
        return Err(refuse(format!(
            "{} already holds a {} database ({}): remove it (or move it away) first, \
             after checking it holds nothing you need",
            dir.display(),
            to.name(),
            existing[0].display()
        )));
    }
    let opts = |path| EngineOptions {
        path,
        cache_capacity_bytes,
        compression,
        flush: super::background_flush::Pacing::fixed(Duration::from_secs(1)),
    };
    let source = Db::open(from, &opts(dir))?;
    let schema = source.open_tree(super::META)?.get(SCHEMA_KEY)?;
    if schema.as_deref() != Some(SCHEMA_VERSION.to_string().as_bytes()) {
        return Err(refuse(format!(
            "the {} store in {} is at layout version {}, this build copies version {}: \
             start the relay once on it with this build (which upgrades it), stop it, then \
             migrate",
            from.name(),
            dir.display(),
            schema.map_or_else(|| "none".into(), |v| String::from_utf8_lossy(&v).into_owned()),
            SCHEMA_VERSION
        )));
    }
    let unknown: Vec<String> =
        source.tree_names()?.into_iter().filter(|n| !TREES.contains(&n.as_str())).collect();
    if !unknown.is_empty() {
        return Err(refuse(format!(
            "the {} store in {} holds trees this build does not know ({}): is it from a \
             newer hookrelay?",
            from.name(),
            dir.display(),
            unknown.join(", ")
        )));
    }
    let staging = staging(dir, to);
    if staging.exists() {
        // What an interrupted copy left: never read, started again.
        std::fs::remove_dir_all(&staging)
            .map_err(io(format!("removing the unfinished copy {}", staging.display())))?;
    }
    let (mut entries, mut bytes) = (0u64, 0u64);
    {
        let target = Db::open(to, &opts(&staging))?;
        for name in TREES {
            let (from_tree, to_tree) = (source.open_tree(name)?, target.open_tree(name)?);
            let (n, b) = copy_tree(&from_tree, &to_tree)?;
            entries += n;
            bytes += b;
        }
        // In the database's own files: they are what the switch moves.
        target.checkpoint()?;
        for name in TREES {
            same(name, &source.open_tree(name)?, &target.open_tree(name)?)?;
        }
    }
    drop(source);
    switch_to(dir, to)?;
    Ok(CopyReport { entries, bytes, from, to, leftovers: files_of(from, dir) })
}

/// Copies every entry of `from` into `to`; returns (entries, bytes).
fn copy_tree(from: &Tree, to: &Tree) -> Result<(u64, u64), StoreError> {
    let (mut entries, mut bytes) = (0u64, 0u64);
    let mut batch = Batch::default();
    let mut in_batch = 0;
    for item in from.iter() {
        let (k, v) = item?;
        entries += 1;
        bytes += (k.len() + v.len()) as u64;
        batch.insert(&k, &v);
        in_batch += 1;
        if in_batch >= BATCH {
            to.apply_batch(std::mem::take(&mut batch))?;
            in_batch = 0;
        }
    }
    to.apply_batch(batch)?;
    Ok((entries, bytes))
}

/// Checks that `to` holds exactly what `from` holds.
fn same(name: &str, from: &Tree, to: &Tree) -> Result<(), StoreError> {
    let mut theirs = to.iter();
    for item in from.iter() {
        let (k, v) = item?;
        match theirs.next().transpose()? {
            Some((k2, v2)) if k[..] == k2[..] && v[..] == v2[..] => {}
            _ => {
                return Err(StoreError::Backend {
                    backend: "migrate",
                    message: format!(
                        "the copy of `{name}` differs from the source at key {}: nothing was \
                         moved into place; run the migration again",
                        crate::store::hex(&k)
                    ),
                })
            }
        }
    }
    if theirs.next().is_some() {
        return Err(StoreError::Backend {
            backend: "migrate",
            message: format!("the copy of `{name}` holds more than the source: run it again"),
        });
    }
    Ok(())
}
