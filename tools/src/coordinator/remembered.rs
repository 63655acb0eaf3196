//! Floors remembered across runs: the largest launch each command line needed when it last
//! ran under this coordinator's name, so that a job that cannot fit is told as it joins.
//!
//! A launch's needs are known only once it is made; without this a job is told it is short
//! at its first launch that cannot run (issue 12: "told at start in one clear line, not hours
//! later"). The file is the coordinator's alone: one line per command, most recently used
//! last, at most [`MAX_COMMANDS`]; written whole to a new file and renamed over the old, mode
//! 0600. A file that is not ours, of another version or with lines that do not parse is
//! reported once and the rest of it used; nothing in it can stop the coordinator.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The file's first line.
const HEADER: &str = "tensile-floors 1";

/// Commands kept (the least recently used go first).
pub const MAX_COMMANDS: usize = 256;

/// The floors of the commands run before, and where they are kept.
#[derive(Debug, Default)]
pub struct RememberedFloors {
    /// `None`: remembered for this coordinator's life only.
    path: Option<PathBuf>,
    /// (command line, floor in bytes), most recently used last.
    floors: Vec<(String, u64)>,
}

impl RememberedFloors {
    /// Floors kept in memory only.
    pub fn in_memory() -> RememberedFloors {
        RememberedFloors::default()
    }

    /// Reads the floors kept at `path` (none yet if it does not exist). The second value is a
    /// problem to log: the file was not usable in part or at all.
    pub fn load(path: PathBuf) -> (RememberedFloors, Option<String>) {
        let mut floors = RememberedFloors {
            path: Some(path.clone()),
            floors: Vec::new(),
        };
        let problem = match read_owned(&path) {
            Ok(None) => None,
            Ok(Some(text)) => floors.parse(&text),
            Err(why) => Some(why),
        };
        let problem = problem.map(|why| {
            format!(
                "remembered floors {}: {why}; {}",
                path.display(),
                if floors.floors.is_empty() {
                    "none used (the file is written anew when a job leaves)"
                } else {
                    "the lines that parse are used"
                }
            )
        });
        (floors, problem)
    }

    /// Takes the lines of `text`; returns what was wrong with it, if anything.
    fn parse(&mut self, text: &str) -> Option<String> {
        let mut lines = text.lines();
        if lines.next() != Some(HEADER) {
            return Some(format!(
                "not a floors file of this version (expected {HEADER:?} first)"
            ));
        }
        let mut bad = 0usize;
        for line in lines {
            let parsed = line
                .split_once('\t')
                .and_then(|(bytes, command)| Some((bytes.parse::<u64>().ok()?, command)));
            match parsed {
                Some((bytes, command)) if bytes > 0 && !command.is_empty() => {
                    self.set(command, bytes)
                }
                _ => bad += 1,
            }
        }
        (bad > 0).then(|| format!("{bad} line(s) that do not parse"))
    }

    /// The floor `command` left when it last ran, if any.
    pub fn get(&self, command: &str) -> Option<u64> {
        self.floors
            .iter()
            .rev()
            .find(|(c, _)| c == command)
            .map(|&(_, f)| f)
    }

    /// Remembers `floor` for `command` (its most recent use).
    pub fn set(&mut self, command: &str, floor: u64) {
        let command = one_line(command);
        self.floors.retain(|(c, _)| *c != command);
        self.floors.push((command, floor));
        if self.floors.len() > MAX_COMMANDS {
            let over = self.floors.len() - MAX_COMMANDS;
            self.floors.drain(..over);
        }
    }

    /// Writes the floors to the file, if there is one.
    pub fn save(&self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut text = String::from(HEADER);
        text.push('\n');
        for (command, floor) in &self.floors {
            text.push_str(&format!("{floor}\t{command}\n"));
        }
        let tmp = temporary_beside(path);
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write the remembered floors {}: {e}", path.display())
        })
    }
}

/// The file at `path` if it exists and belongs to this user (`Ok(None)`: it does not exist).
fn read_owned(path: &Path) -> Result<Option<String>, String> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_file() || meta.uid() != uid {
        return Err(format!(
            "not a plain file of this user (uid {}, ours {uid})",
            meta.uid()
        ));
    }
    std::fs::read_to_string(path)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// A new file's name beside `path`, for this process.
fn temporary_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// `command` as one line of the file: tabs and line breaks become spaces.
fn one_line(command: &str) -> String {
    command.replace(['\t', '\n', '\r'], " ")
}

/// Where a coordinator named `name` keeps its floors by default: beside the log a job starts
/// it with, in the temporary directory, named for this user.
pub fn default_path(name: &str) -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("tensile-coordinator-{uid}-{name}.floors"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tensile-floors-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("floors")
    }

    #[test]
    fn floors_written_are_read_back_by_the_next_coordinator() {
        let path = scratch("roundtrip");
        let (mut f, problem) = RememberedFloors::load(path.clone());
        assert_eq!(problem, None, "no file yet is no problem");
        assert_eq!(f.get("python train.py"), None);
        f.set("python train.py", 3 << 30);
        f.set("python eval.py\t--big", 5 << 30);
        f.set("python train.py", 4 << 30);
        f.save().unwrap();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, problem) = RememberedFloors::load(path.clone());
        assert_eq!(problem, None);
        assert_eq!(again.get("python train.py"), Some(4 << 30));
        assert_eq!(again.get("python eval.py --big"), Some(5 << 30));
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn the_least_recently_used_commands_go_first() {
        let mut f = RememberedFloors::in_memory();
        for i in 0..MAX_COMMANDS + 2 {
            f.set(&format!("job {i}"), 1 + i as u64);
        }
        f.set("job 2", 7);
        f.set("one more", 9);
        assert_eq!(f.get("job 0"), None);
        assert_eq!(f.get("job 1"), None);
        assert_eq!(f.get("job 3"), None, "pushed out by the last one");
        assert_eq!(f.get("job 2"), Some(7));
        assert_eq!(f.get("one more"), Some(9));
        assert_eq!(f.floors.len(), MAX_COMMANDS);
    }

    #[test]
    fn a_file_of_another_version_or_with_bad_lines_is_said_and_what_parses_is_used() {
        let path = scratch("bad");
        std::fs::write(&path, "tensile-floors 9\n100\tx\n").unwrap();
        let (f, problem) = RememberedFloors::load(path.clone());
        let problem = problem.expect("another version is said");
        assert!(
            problem.contains("not a floors file of this version"),
            "{problem}"
        );
        assert!(problem.contains("none used"), "{problem}");
        assert_eq!(f.get("x"), None);
        std::fs::write(
            &path,
            "tensile-floors 1\n100\tx\nnot a number\tcmd\n\n0\tzero\n200\ty",
        )
        .unwrap();
        let (f, problem) = RememberedFloors::load(path.clone());
        let problem = problem.expect("bad lines are said");
        assert!(problem.contains("3 line(s)"), "{problem}");
        assert_eq!(
            (f.get("x"), f.get("y"), f.get("zero")),
            (Some(100), Some(200), None)
        );
        // Truncated in the middle of a line: the part before it is used.
        std::fs::write(&path, "tensile-floors 1\n100\tx\n20").unwrap();
        let (f, problem) = RememberedFloors::load(path);
        assert!(problem.is_some());
        assert_eq!(f.get("x"), Some(100));
    }

    #[test]
    fn a_link_in_place_of_the_file_is_not_followed() {
        let path = scratch("link");
        let target = path.with_file_name("elsewhere");
        std::fs::write(&target, format!("{HEADER}\n100\tx\n")).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let (f, problem) = RememberedFloors::load(path);
        assert!(problem.unwrap().contains("not a plain file"));
        assert_eq!(f.get("x"), None);
    }
}
