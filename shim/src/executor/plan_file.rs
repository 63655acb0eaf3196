//! `TENSILE_PLAN=FILE`: an encoded plan read at start (for tests, and to try a plan made
//! offline with `tensile replay --emit-plan`).

use std::path::Path;

use tensile_protocol::plan::ExecPlan;

/// Reads and decodes the plan in `path`. The error is one line naming the file and the
/// cause (missing, unreadable, bad magic, another format version, invalid).
pub fn read(path: &Path) -> Result<ExecPlan, String> {
    let cant = |why: String| {
        format!(
            "TENSILE_PLAN={}: cannot use the plan: {why}",
            path.display()
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| cant(e.to_string()))?;
    if meta.len() > tensile_protocol::plan::MAX_PLAN_BYTES as u64 {
        return Err(cant(format!(
            "{} bytes, more than the {} a plan may have",
            meta.len(),
            tensile_protocol::plan::MAX_PLAN_BYTES
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| cant(e.to_string()))?;
    ExecPlan::decode(&bytes).map_err(|e| cant(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_file_gets_one_line_with_the_file_and_the_cause() {
        let dir = std::env::temp_dir();
        let missing = dir.join(format!("tensile-no-such-plan-{}", std::process::id()));
        let e = read(&missing).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "TENSILE_PLAN={}: cannot use the plan: ",
                missing.display()
            )) && !e.contains('\n'),
            "{e}"
        );
        let junk = dir.join(format!("tensile-junk-plan-{}", std::process::id()));
        std::fs::write(&junk, b"definitely not a plan").unwrap();
        let e = read(&junk).unwrap_err();
        assert!(e.ends_with("not a libtensile plan (bad magic)"), "{e}");
        let _ = std::fs::remove_file(&junk);
    }
}
