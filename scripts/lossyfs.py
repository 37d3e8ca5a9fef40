#!/usr/bin/env python3
"""lossyfs: a loopback filesystem that loses unsynced writes at a power cut.

    lossyfs.py BACKING MOUNTPOINT

Everything under MOUNTPOINT is BACKING, except that file contents written through the
mount stay in this process's memory until the file is fsynced (fsync or fdatasync);
reads see them. Killing this process is the power cut: what was not fsynced is gone,
as from a disk cache, while what was fsynced is on BACKING. Metadata (create, rename,
unlink, mkdir) reaches BACKING at once, as on a journalled filesystem. A clean unmount
writes everything (a shutdown syncs).

SIGKILL keeps the page cache, so it cannot catch a missing fsync; this can (the idea
of LazyFS). Used by tests/integration/power_loss.rs; needs mfusepy and fuse3 (scripts/test.sh
installs both).
"""

import errno
import os
import sys
import threading

import mfusepy as fuse


class Lossy(fuse.Operations):
    use_ns = True

    def __init__(self, root):
        self.root = root
        self.mutex = threading.RLock()
        # path -> ops not yet synced, in order: ("w", offset, bytes) or ("t", length)
        self.pending = {}

    def _full(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    # ---- contents: held until fsync

    def _size(self, path, size):
        for op in self.pending.get(path, ()):
            if op[0] == "w":
                size = max(size, op[1] + len(op[2]))
            else:
                size = op[1]
        return size

    def read(self, path, size, offset, fh):
        with self.mutex:
            full = self._full(path)
            with open(full, "rb") as f:
                f.seek(offset)
                buf = bytearray(f.read(size))
                length = os.fstat(f.fileno()).st_size
            for op in self.pending.get(path, ()):
                if op[0] == "t":
                    length = op[1]
                    del buf[max(0, length - offset):]
                    continue
                _, at, data = op
                start, end = max(at, offset), min(at + len(data), offset + size)
                if start < end:
                    if len(buf) < end - offset:
                        buf.extend(bytes(end - offset - len(buf)))
                    buf[start - offset:end - offset] = data[start - at:end - at]
                length = max(length, at + len(data))
            end = max(0, min(size, length - offset))
            if len(buf) < end:
                buf.extend(bytes(end - len(buf)))
            return bytes(buf[:end])

    def write(self, path, data, offset, fh):
        with self.mutex:
            self.pending.setdefault(path, []).append(("w", offset, bytes(data)))
            return len(data)

    def truncate(self, path, length, fh=None):
        with self.mutex:
            self.pending.setdefault(path, []).append(("t", length))
            return 0

    def _apply(self, path):
        ops = self.pending.pop(path, None)
        if not ops:
            return
        fd = os.open(self._full(path), os.O_WRONLY)
        try:
            for op in ops:
                if op[0] == "w":
                    os.pwrite(fd, op[2], op[1])
                else:
                    os.ftruncate(fd, op[1])
            os.fsync(fd)
        finally:
            os.close(fd)

    def fsync(self, path, datasync, fh):
        with self.mutex:
            self._apply(path)
            return 0

    def flush(self, path, fh):
        return 0  # close(2) makes nothing durable

    def release(self, path, fh):
        return 0

    def destroy(self, path):
        with self.mutex:
            for p in list(self.pending):
                self._apply(p)

    # ---- metadata: at once

    def getattr(self, path, fh=None):
        with self.mutex:
            st = os.lstat(self._full(path))
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_blocks")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            attrs["st_size"] = self._size(path, st.st_size)
            return attrs

    def access(self, path, amode):
        if not os.access(self._full(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def open(self, path, flags):
        if not os.path.exists(self._full(path)):
            raise fuse.FuseOSError(errno.ENOENT)
        return 0

    def create(self, path, mode, fi=None):
        with self.mutex:
            os.close(os.open(self._full(path), os.O_WRONLY | os.O_CREAT, mode))
            self.pending.pop(path, None)
            return 0

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._full(path))

    def mkdir(self, path, mode):
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path):
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path):
        with self.mutex:
            os.unlink(self._full(path))
            self.pending.pop(path, None)
            return 0

    def rename(self, old, new):
        with self.mutex:
            os.rename(self._full(old), self._full(new))
            self.pending.pop(new, None)
            if old in self.pending:
                self.pending[new] = self.pending.pop(old)
            return 0

    def chmod(self, path, mode):
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        os.utime(self._full(path), ns=times)
        return 0

    def statfs(self, path):
        st = os.statvfs(self._full(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def fsyncdir(self, path, datasync, fh):
        return 0


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: lossyfs.py BACKING MOUNTPOINT")
    backing, mountpoint = sys.argv[1:]
    fuse.FUSE(Lossy(os.path.abspath(backing)), mountpoint, foreground=True, nothreads=True)


if __name__ == "__main__":
    main()
