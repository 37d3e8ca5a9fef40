//! Which engine's store in a data directory is the current one, and the one atomic
//! step that changes it.
//!
//! `hookrelay migrate --to` builds the new store in `.migrate-{engine}/` inside the data
//! directory, checks it and makes it durable (`copy.rs`). Then the switch:
//! 1. **The commit**: the file [`CURRENT`] is written with the new engine's name, by
//!    one rename over the old one (written beside, fsynced, renamed, the directory
//!    fsynced). Before this rename the old store is the current one, whatever else
//!    is on disk; after it, the new one is, even while its files are still staged.
//! 2. **The move**: each file of the copy is renamed into the data directory, then
//!    the staging directory is removed. A crash part-way leaves some files staged;
//!    whoever opens the directory next ([`finish_switch`], before every open and
//!    before every copy) moves the rest: the switch is rolled forward, never half
//!    done.
//!
//! A directory without [`CURRENT`] (every store before this file existed, and every
//! store never migrated) is what its files say, as before. With it, the other engine's
//! files are the old copy: a relay set to that engine is refused instead of starting
//! on stale data beside the current store.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{files_of, Engine};
use crate::store::StoreError;

/// The marker's file name in the data directory: the current engine's name and a
/// newline.
pub(crate) const CURRENT: &str = "CURRENT";

/// The staging directory a copy to `engine` is built in.
pub(crate) fn staging(dir: &Path, engine: Engine) -> PathBuf {
    dir.join(format!(".migrate-{}", engine.name()))
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| StoreError::Backend { backend: "migrate", message: format!("{what}: {e}") }
}

/// The engine [`CURRENT`] names in `dir`, if the file is there.
pub(crate) fn current(dir: &Path) -> Result<Option<Engine>, StoreError> {
    let path = dir.join(CURRENT);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
    };
    match text.trim() {
        "sled" => Ok(Some(Engine::Sled)),
        "redb" => Ok(Some(Engine::Redb)),
        other => Err(StoreError::Config(format!(
            "{} says {other:?}, not \"sled\" or \"redb\": it names the engine whose store in \
             this directory is current (written by `hookrelay migrate --to`); put the right \
             name back, or remove the file if only one engine's files are there",
            path.display()
        ))),
    }
}

/// Switches `dir` to the `engine` store built in its staging directory (a migration's
/// copy, a restore): the store's files and their names made durable, then one rename of
/// `CURRENT` (the commit), then the files moved into place (what a crash leaves of that
/// move, the next open finishes).
pub(crate) fn switch_to(dir: &Path, engine: Engine) -> Result<(), StoreError> {
    let staging = staging(dir, engine);
    for file in super::files_of(engine, &staging) {
        if file.is_dir() {
            sync_dir(&file)?;
        }
    }
    sync_dir(&staging)?;
    commit(dir, engine)?;
    finish_switch(dir)?;
    Ok(())
}

/// Makes `engine` the current store of `dir`: the commit of a switch, one rename.
pub(crate) fn commit(dir: &Path, engine: Engine) -> Result<(), StoreError> {
    let (path, beside) = (dir.join(CURRENT), dir.join(format!(".{CURRENT}.new")));
    let mut file =
        std::fs::File::create(&beside).map_err(io(format!("writing {}", beside.display())))?;
    file.write_all(format!("{}\n", engine.name()).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(format!("writing {}", beside.display())))?;
    drop(file);
    std::fs::rename(&beside, &path).map_err(io(format!(
        "renaming {} to {}",
        beside.display(),
        path.display()
    )))?;
    sync_dir(dir)
}

/// Makes the entries of `dir` durable (a rename is only durable once its directory is).
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing the directory {}", dir.display())))
}

/// Finishes a switch a crash interrupted: when [`CURRENT`] names an engine whose
/// staging directory is still there, its files are moved into place and it is
/// removed. Returns the engine when it moved anything. Idempotent: a file already
/// moved is skipped. A staging directory of an engine that is not current is an
/// unfinished copy: left alone (the next `migrate --to` starts it again).
pub(crate) fn finish_switch(dir: &Path) -> Result<Option<Engine>, StoreError> {
    let Some(engine) = current(dir)? else { return Ok(None) };
    let staged = staging(dir, engine);
    if !staged.exists() {
        return Ok(None);
    }
    let mut moved = 0;
    for file in files_of(engine, &staged) {
        let Some(name) = file.file_name() else { continue };
        let into = dir.join(name);
        std::fs::rename(&file, &into).map_err(io(format!(
            "moving {} to {} (finishing the switch to {}: run the relay or `hookrelay \
             migrate` again once this is fixed; the switch goes on from where it stopped)",
            file.display(),
            into.display(),
            engine.name()
        )))?;
        moved += 1;
    }
    sync_dir(dir)?;
    std::fs::remove_dir_all(&staged).map_err(io(format!("removing {}", staged.display())))?;
    sync_dir(dir)?;
    if moved > 0 {
        tracing::warn!(dir = %dir.display(), engine = engine.name(), files = moved,
            "finished a switch to another engine that a crash had interrupted (hookrelay migrate --to): its checked copy is now in place");
    }
    Ok(Some(engine))
}

/// Refuses to open `engine`'s store in `dir` when [`CURRENT`] names the other engine
/// (the files there are the copy a migration left behind), or names this one and none
/// of its files are there (a store lost or moved away: never started empty in its
/// place).
pub(crate) fn check_open(dir: &Path, engine: Engine) -> Result<(), StoreError> {
    match current(dir)? {
        Some(named) if named != engine => Err(StoreError::Config(format!(
            "{dir} was moved to {named} by `hookrelay migrate --to {named}` (its {CURRENT} \
             file says so): the {engine} files there are the copy it was made from, stale \
             since. Set storage.backend = \"{named}\" (or leave it unset) to run on the \
             current store; to move back, run `hookrelay migrate --to {engine}` once the \
             {engine} files are removed",
            dir = dir.display(),
            named = named.name(),
            engine = engine.name(),
        ))),
        Some(_) if files_of(engine, dir).is_empty() => Err(StoreError::Config(format!(
            "{dir}/{CURRENT} names {engine} as the current store, but no {engine} database \
             is there: was it moved or deleted? Put it back; a relay never starts empty in \
             place of a store it has had",
            dir = dir.display(),
            engine = engine.name(),
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_cut_short_after_its_commit_is_finished_and_one_before_it_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(current(d).unwrap(), None);
        // A copy staged, not committed: nothing moves, the staged copy stays.
        let staged = staging(d, Engine::Sled);
        std::fs::create_dir_all(staged.join("blobs")).unwrap();
        for f in ["conf", "db"] {
            std::fs::write(staged.join(f), f).unwrap();
        }
        assert_eq!(finish_switch(d).unwrap(), None);
        assert!(staged.join("db").exists() && !d.join("db").exists());
        // Committed, and cut short after moving `conf`: the rest is moved.
        commit(d, Engine::Sled).unwrap();
        assert_eq!(current(d).unwrap(), Some(Engine::Sled));
        std::fs::rename(staged.join("conf"), d.join("conf")).unwrap();
        assert_eq!(finish_switch(d).unwrap(), Some(Engine::Sled));
        for f in ["conf", "db", "blobs"] {
            assert!(d.join(f).exists(), "{f} moved");
        }
        assert_eq!(std::fs::read_to_string(d.join("db")).unwrap(), "db");
        assert!(!staged.exists());
        // Again: nothing to do.
        assert_eq!(finish_switch(d).unwrap(), None);
        // The stale engine is refused; the current one opens.
        assert!(check_open(d, Engine::Sled).is_ok());
        let stale = check_open(d, Engine::Redb).unwrap_err().to_string();
        assert!(stale.contains("moved to sled") && stale.contains("stale"), "{stale}");
    }

    #[test]
    fn a_marker_without_its_store_or_with_nonsense_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        commit(d, Engine::Redb).unwrap();
        let gone = check_open(d, Engine::Redb).unwrap_err().to_string();
        assert!(gone.contains("no redb database is there"), "{gone}");
        std::fs::write(d.join(CURRENT), "postgres\n").unwrap();
        let bad = current(d).unwrap_err().to_string();
        assert!(bad.contains("\"postgres\"") && bad.contains("put the right name back"), "{bad}");
    }
}
