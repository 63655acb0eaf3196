//! Running workloads under `LD_PRELOAD=libtensile.so` on the simulated GPU.
//!
//! `cargo test` builds this package's binaries (the workloads) but not the cdylibs of other
//! packages, so [`artifacts`] builds `libtensile.so` and the simulated `libcuda.so` once per
//! test binary with a nested `cargo build` into the same target directory and profile as
//! the running test (both derived from the test executable's path), together with the
//! `tensile` command (for `tensile demo`), and links
//! `<target>/<profile>/simgpu/libcuda.so.1` (and `libcuda.so`) to the simulator.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The built libraries.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `libtensile.so`.
    pub preload: PathBuf,
    /// A directory holding `libcuda.so.1` (the simulated GPU), for `LD_LIBRARY_PATH`.
    pub simgpu_dir: PathBuf,
    /// The `tensile` command, next to `libtensile.so`, the workloads and `libcuda.so`.
    pub tensile: PathBuf,
}

/// The target directory and profile directory of the running executable:
/// `<target>/<profile>/deps/<exe>` or `<target>/<profile>/<exe>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let mut dir = exe
        .parent()
        .expect("the executable is in a directory")
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// Builds (once per process) and returns the libraries the tests need.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let profile_dir = profile_dir();
        let target_dir = profile_dir
            .parent()
            .expect("the profile directory has a parent")
            .to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO")
            .map(PathBuf::from)
            .or_else(|| option_env!("CARGO").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("cargo"));
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut cmd = Command::new(&cargo);
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "tensile-preload",
            "-p",
            "tensile-simgpu",
            "-p",
            "tensile-tools",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
        if release {
            cmd.arg("--release");
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", cargo.display()));
        assert!(
            out.status.success(),
            "building libtensile.so and the simulated GPU failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let preload = profile_dir.join("libtensile.so");
        let sim = profile_dir.join("libcuda.so");
        assert!(
            preload.exists(),
            "{} missing after the build",
            preload.display()
        );
        assert!(sim.exists(), "{} missing after the build", sim.display());
        let simgpu_dir = profile_dir.join("simgpu");
        std::fs::create_dir_all(&simgpu_dir).expect("creating the simgpu directory");
        for name in ["libcuda.so.1", "libcuda.so"] {
            let link = simgpu_dir.join(name);
            // Several test binaries may race here; a link that already points right is fine.
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(&sim, &link) {
                assert!(link.exists(), "linking {}: {e}", link.display());
            }
        }
        Artifacts {
            preload,
            simgpu_dir,
            tensile: profile_dir.join("tensile"),
        }
    })
}

/// One run of a workload.
#[derive(Debug, Clone)]
pub struct Run {
    exe: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    preload: bool,
}

/// What a run printed, and how it ended.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Panics with the output unless the run succeeded.
    #[track_caller]
    pub fn assert_ok(&self, what: &str) -> &Self {
        assert!(
            self.success,
            "{what} failed ({:?})\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// Panics with the stderr if it has an error line or a panic in it.
    #[track_caller]
    pub fn assert_quiet(&self, what: &str) -> &Self {
        assert!(
            !self.stderr.contains("ERROR") && !self.stderr.contains("panicked"),
            "{what}: an error or a panic in stderr\n{}",
            self.stderr
        );
        self
    }
}

impl Run {
    /// A run of the executable `exe` (pass `env!("CARGO_BIN_EXE_<name>")`).
    pub fn new(exe: impl Into<PathBuf>) -> Run {
        Run {
            exe: exe.into(),
            args: Vec::new(),
            env: Vec::new(),
            preload: false,
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Run {
        self.args.push(a.into());
        self
    }

    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Run {
        self.env.push((k.into(), v.into()));
        self
    }

    /// With `LD_PRELOAD=libtensile.so`.
    pub fn preload(mut self, on: bool) -> Run {
        self.preload = on;
        self
    }

    /// With `TENSILE_TRACE=path` (and the shim).
    pub fn trace(self, path: &Path) -> Run {
        self.preload(true)
            .env("TENSILE_TRACE", path.to_string_lossy())
    }

    /// The command this run is: the executable, its arguments, and the environment (no
    /// inherited libtensile or simulator settings).
    fn command(&self) -> Command {
        let a = artifacts();
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args);
        // Start from a clean slate: no inherited libtensile or simulator settings.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("TENSILE_") || k == "LD_PRELOAD" {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("LD_LIBRARY_PATH", &a.simgpu_dir);
        // Plans are learned in the process unless a test asks for a coordinator: a test must
        // not start (or join) a machine-wide coordinator behind its neighbours' backs.
        cmd.env("TENSILE_COORDINATOR", "off");
        if self.preload {
            cmd.env("LD_PRELOAD", &a.preload);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs to completion and captures the output.
    pub fn output(&self) -> Output {
        let out = self
            .command()
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.exe.display()));
        Output {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Starts the run and returns at once; its output is read as it comes (see [`Running`]).
    pub fn spawn(&self) -> Running {
        let mut child = self
            .command()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.exe.display()));
        let lines = std::sync::Arc::new(Lines::default());
        let readers = vec![
            reader(child.stdout.take().map(|o| Box::new(o) as _), &lines, false),
            reader(child.stderr.take().map(|e| Box::new(e) as _), &lines, true),
        ];
        Running {
            child,
            lines,
            readers,
        }
    }
}

/// What a [`Running`] run has printed so far.
#[derive(Default)]
struct Lines {
    /// stdout and stderr so far.
    text: std::sync::Mutex<(String, String)>,
    grew: std::sync::Condvar,
}

/// A thread that appends what `from` prints to `lines` (stderr if `err`) until it closes.
fn reader(
    from: Option<Box<dyn std::io::Read + Send>>,
    lines: &std::sync::Arc<Lines>,
    err: bool,
) -> std::thread::JoinHandle<()> {
    let lines = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let Some(from) = from else { return };
        for line in std::io::BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            let mut text = lines.text.lock().unwrap();
            let to = if err { &mut text.1 } else { &mut text.0 };
            to.push_str(&line);
            to.push('\n');
            lines.grew.notify_all();
        }
    })
}

/// A run started with [`Run::spawn`]: its output so far can be waited for, it can be
/// signalled, and [`Running::wait`] gives its [`Output`].
pub struct Running {
    child: std::process::Child,
    lines: std::sync::Arc<Lines>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    /// A run a failed test leaves behind is killed, not leaked.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until stdout (`err` false) or stderr has a line containing `text`, or until
    /// `patience` has passed (then false).
    pub fn wait_for(&self, err: bool, text: &str, patience: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + patience;
        let mut now = self.lines.text.lock().unwrap();
        loop {
            let seen = if err { &now.1 } else { &now.0 };
            if seen.contains(text) {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            now = self.lines.grew.wait_timeout(now, left).unwrap().0;
        }
    }

    /// stdout so far.
    pub fn stdout(&self) -> String {
        self.lines.text.lock().unwrap().0.clone()
    }

    /// stderr so far.
    pub fn stderr(&self) -> String {
        self.lines.text.lock().unwrap().1.clone()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) of a child this value started and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits for the process to end and returns all it printed.
    pub fn wait(mut self) -> Output {
        let status = self.child.wait().expect("waiting for a child");
        for r in std::mem::take(&mut self.readers) {
            let _ = r.join();
        }
        let (stdout, stderr) = std::mem::take(&mut *self.lines.text.lock().unwrap());
        Output {
            success: status.success(),
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

/// A fresh path for a trace file in the system temp directory.
pub fn temp_trace(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "tensile-e2e-{}-{n}-{name}.trace",
        std::process::id()
    ))
}

/// A finished process's status, stdout and stderr, for an assertion's message.
pub fn describe(out: &std::process::Output) -> String {
    format!(
        "--- status {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
