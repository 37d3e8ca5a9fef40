//! The allocator's share of a bounded relay: memory the heap no longer uses goes back
//! to the system (on redb, the engine whose memory the relay bounds), and none is held
//! in huge pages (always).
//!
//! The binary's global allocator is mimalloc (`main.rs`). It keeps the pages freed by
//! a burst (a flood of callbacks, a dispatch batch, a prune) for its purge delay, one
//! second in its v3, before giving them back to the OS: under steady load that is
//! resident memory no one uses. A relay on redb has them given back at once instead:
//! measured on redb at 300,000 events, RSS 159 → 133 MB, fill rate and ack latency no
//! worse; at 1 M with the shipped defaults, 142 MB (peak 147) with the delay
//! (BENCHMARKS.md, "Capacity").

use crate::config::{StorageBackend, StorageConfig};

/// Has the kernel back the relay's memory with base pages only: no transparent huge
/// pages. mimalloc advises huge pages for its arenas (`allow_thp`, on by default), and
/// a 2 MiB page is resident whole as soon as one of its bytes is, however little of
/// it the heap uses: measured on redb at 1 M events under a 150 MiB limit, RSS 115 MB
/// (peak 127) with 16-30 MB of it huge pages, against 87 MB without
/// (BENCHMARKS.md, "Capacity"). The process-wide switch, `PR_SET_THP_DISABLE`, also
/// covers the arenas mimalloc reserved before this runs. Returns whether the kernel
/// took it (Linux since 3.15).
pub(crate) fn refuse_transparent_huge_pages() -> bool {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes integers and sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 }
}

/// mimalloc's `mi_option_purge_delay`: index 15 of `mi_option_e` in its v2 and v3
/// headers alike; libmimalloc-sys 0.1.49 does not name it (a test below pins it by its
/// default).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Whether freed memory goes back to the OS at once: on redb, whose memory is its
/// bounded cache and the relay's own, so that what a burst freed is not counted in
/// RSS for a second (the shipped defaults then keep under 150 MB at 10 M events). Not
/// on sled, whose memory grows with its history whatever the allocator does, nor on
/// PostgreSQL (the relay holds no store; not measured there).
pub(crate) fn returns_freed_memory_at_once(storage: &StorageConfig) -> bool {
    storage.backend() == StorageBackend::Redb
}

/// Has freed memory returned to the OS at once rather than after mimalloc's delay.
pub(crate) fn return_freed_memory_at_once() {
    // SAFETY: sets one integer option, which mimalloc reads atomically at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transparent_huge_pages_are_refused_for_the_whole_process() {
        assert!(refuse_transparent_huge_pages(), "{}", std::io::Error::last_os_error());
        // SAFETY: reads a flag of this process.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }, 1);
    }

    #[test]
    fn freed_memory_goes_back_at_once_on_redb_alone() {
        let on = |backend| {
            let storage = StorageConfig { backend: Some(backend), ..StorageConfig::default() };
            returns_freed_memory_at_once(&storage)
        };
        assert!(on(StorageBackend::Redb));
        assert!(!on(StorageBackend::Sled));
        assert!(!on(StorageBackend::Postgres));
        // Unset and unresolved: redb, the default for a new data directory.
        assert!(returns_freed_memory_at_once(&StorageConfig::default()));
    }

    #[test]
    fn the_option_set_is_the_purge_delay() {
        // SAFETY: reads and sets integer options.
        let (before, after) = unsafe {
            // A neighbour's default would be 1 (eager commit delay) or 0 (NUMA nodes):
            // 1000 ms is the purge delay's, unless the environment set it.
            let before = libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY);
            return_freed_memory_at_once();
            (before, libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY))
        };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(before, 1000, "index {MI_OPTION_PURGE_DELAY} is not mimalloc's purge delay");
        }
        assert_eq!(after, 0);
    }
}
