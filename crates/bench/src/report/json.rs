//! `--json FILE`: the whole [`Report`], configuration included, for
//! scripts and for the end-to-end tests that assert on counts.

use std::path::Path;

use crate::report::Report;
use crate::util::error::BenchError;

/// Writes `r` to `path` as pretty JSON.
pub fn write(r: &Report, path: &Path) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(r)?;
    std::fs::write(path, text + "\n")?;
    Ok(())
}
