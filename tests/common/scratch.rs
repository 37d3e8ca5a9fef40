//! Filesystems mounted for fault tests: a small tmpfs or a loop-mounted ext4 image is
//! a real full disk (the tests run as root in CI; where mounting is impossible they
//! fail, saying why: a fault test that passes without its fault proves nothing).

use std::path::Path;
use std::process::Command;

/// A small filesystem mounted for a test: a tmpfs, or an ext4 image on a loop device.
/// Always unmounted (and the image removed) when dropped.
pub struct Scratch {
    dir: tempfile::TempDir,
    image: Option<tempfile::NamedTempFile>,
}

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Tmpfs,
    Ext4,
}

impl Scratch {
    /// Mounts one, or fails the test saying why.
    pub fn mount(kind: Kind, mib: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut image = None;
        let out = match kind {
            Kind::Tmpfs => Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
                .arg(dir.path())
                .output(),
            Kind::Ext4 => {
                let file = tempfile::NamedTempFile::new().expect("image file");
                file.as_file().set_len(mib << 20).expect("size the image");
                let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(file.path()).output();
                match mkfs {
                    Ok(o) if o.status.success() => {}
                    other => panic!("mkfs.ext4 failed (is e2fsprogs installed?): {other:?}"),
                }
                let out = Command::new("mount")
                    .args(["-o", "loop"])
                    .arg(file.path())
                    .arg(dir.path())
                    .output();
                image = Some(file);
                out
            }
        };
        match out {
            Ok(o) if o.status.success() => Self { dir, image },
            Ok(o) => panic!(
                "cannot mount a {kind:?} for this full-disk test (it needs root and loop \
                 devices, as in CI): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!("cannot run mount for this full-disk test (util-linux): {e}"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Lazy, so a file still open somewhere cannot keep the mount.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        let _ = self.image.take();
    }
}

/// Writes `mib` MiB of zeros to `path`.
pub fn fill(path: &Path, mib: usize) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&chunk).expect("filler write");
    }
    f.sync_all().expect("filler sync");
}

/// Free bytes of the filesystem holding `path`, as an unprivileged writer sees them.
pub fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail as u64 * st.f_frsize as u64
}
