//! Where a tool's child runs happen: a scratch directory for runs on the simulated GPU (it
//! holds `libcuda.so.1` → the simulator, so that `LD_LIBRARY_PATH` pointing here makes a child
//! load it, and whatever the runs write: scripts, traces; removed on drop unless kept), and
//! running a child while echoing its progress.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

/// Runs `cmd` (`what` names it in errors) to completion with its stdout captured, passing each
/// line of its stderr to `echo` as it comes (to show progress); returns the output and every
/// stderr line.
pub fn run_echoing(
    mut cmd: Command,
    what: &str,
    mut echo: impl FnMut(&str) + Send + 'static,
) -> Result<(Output, Vec<String>), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr pipe")?;
    let reader = std::thread::spawn(move || {
        let mut log = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            echo(&line);
            log.push(line);
        }
        log
    });
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {what}: {e}"))?;
    Ok((out, reader.join().unwrap_or_default()))
}
