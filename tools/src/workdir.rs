//! A scratch directory for a tool's child runs on the simulated GPU: it holds
//! `libcuda.so.1` → the simulator (so that `LD_LIBRARY_PATH` pointing here makes a child load
//! it) and whatever the runs write (scripts, traces); removed on drop unless kept.

use std::path::{Path, PathBuf};

pub struct WorkDir {
    pub path: PathBuf,
    keep: bool,
}

impl WorkDir {
    /// `<tmp>/tensile-<tool>-<pid>`, with the simulator linked in.
    pub fn new(tool: &str, simulator: &Path, keep: bool) -> Result<WorkDir, String> {
        let path = std::env::temp_dir().join(format!("tensile-{tool}-{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let dir = WorkDir { path, keep };
        let link = dir.path.join("libcuda.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(simulator, &link)
            .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
        Ok(dir)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
