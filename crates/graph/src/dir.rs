//! [`DataDir`]: one process at a time owns a node's data directory.
//!
//! A running node holds its graph store open for as long as it runs; a
//! bulk load (`myriad graph load`) writes the same files. Both take this
//! lock first, so a load refuses with a clear error while a node runs on
//! the directory instead of waiting on SQLite's write lock, and a second
//! node cannot start on a directory that is in use.
//!
//! The lock is `flock(LOCK_EX | LOCK_NB)` on the file [`LOCK_FILE`] in the
//! directory. The kernel drops it when the holder's descriptor is closed,
//! including when the process is killed, so a crash never leaves a stale
//! lock behind; the pid written into the file only helps the error message.
//! Two `DataDir::lock` calls in the same process conflict as well (each
//! opens its own descriptor).
//!
//! It must not hold anything but the lock: what lives in the directory is
//! each owner's business (the graph store's file is
//! [`crate::sqlite::FILE_NAME`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The lock file's name inside a data directory.
pub const LOCK_FILE: &str = "myriad.lock";

/// A data directory this process holds exclusively until the value is
/// dropped.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// The locked descriptor; closing it (on drop) releases the lock.
    _lock: File,
}

/// Why a data directory could not be taken.
#[derive(Debug, Error)]
pub enum DataDirError {
    /// Another process (or another `DataDir` in this one) holds it.
    #[error("data directory {} is in use by another process{}", .path.display(), holder_text(*.holder))]
    InUse { path: PathBuf, holder: Option<u32> },
    #[error("data directory {}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
}

fn holder_text(holder: Option<u32>) -> String {
    holder.map_or_else(String::new, |pid| format!(" (pid {pid})"))
}

impl DataDir {
    /// Creates the directory if needed and locks it, without waiting.
    pub fn lock(path: impl AsRef<Path>) -> Result<DataDir, DataDirError> {
        let path = path.as_ref().to_path_buf();
        let io_error = |source| DataDirError::Io {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(&path).map_err(io_error)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path.join(LOCK_FILE))
            .map_err(io_error)?;
        // SAFETY: flock on a descriptor `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io_error(error));
            }
            let mut text = String::new();
            let holder = file
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            return Err(DataDirError::InUse { path, holder });
        }
        // Informational only: the lock is the flock, not the contents.
        let write_pid = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.rewind()?;
            writeln!(file, "{}", std::process::id())
        };
        write_pid(&mut file).map_err(io_error)?;
        Ok(DataDir { path, _lock: file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The graph store's file in this directory.
    pub fn graph_file(&self) -> PathBuf {
        self.path.join(crate::sqlite::FILE_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_held_by_one_owner_until_dropped() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("data");
        let held = DataDir::lock(&path).unwrap();
        assert!(path.is_dir(), "created on first use");
        assert_eq!(held.graph_file(), path.join("graph.sqlite3"));
        match DataDir::lock(&path) {
            Err(DataDirError::InUse { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()));
            }
            other => panic!("{other:?}"),
        }
        let error = DataDir::lock(&path).unwrap_err().to_string();
        assert!(
            error.contains("is in use by another process (pid "),
            "{error}"
        );
        drop(held);
        DataDir::lock(&path).expect("free again once dropped");
    }

    #[test]
    fn a_path_that_cannot_be_a_directory_is_an_io_error() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("plain");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(DataDir::lock(&file), Err(DataDirError::Io { .. })));
    }
}
