//! `TENSILE_SHM_DIR`: segments are made, found, listed and removed in the directory it names
//! (read once per process, so this test binary sets it before anything opens a segment and
//! holds this one test only).

use tensile_protocol::segment::{list_names, shm_name, shm_path};
use tensile_protocol::shm::{shm_dir, SHM_DIR_VARIABLE};
use tensile_protocol::{CoordinatorSegment, Geometry, JobClient, JobOptions, SegmentView};

#[test]
fn segments_are_made_found_listed_and_removed_in_tensile_shm_dir() {
    let dir = std::env::temp_dir().join(format!("tensile-shm-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Before anything of this binary reads it (it holds this one test).
    std::env::set_var(SHM_DIR_VARIABLE, &dir);
    assert_eq!(shm_dir(), Ok(dir.as_path()));
    let name = format!("shm-dir-{}", std::process::id());
    let path = dir.join(shm_name(&name).unwrap());
    assert_eq!(
        shm_path(&shm_name(&name).unwrap()),
        path.display().to_string()
    );
    let geometry = Geometry {
        slot_count: 2,
        ring_bytes: 64 << 10,
        command_bytes: 16 << 10,
    };
    let coordinator = CoordinatorSegment::create(&name, geometry).unwrap();
    assert!(path.is_file(), "no segment at {}", path.display());
    assert!(
        !std::path::Path::new("/dev/shm")
            .join(shm_name(&name).unwrap())
            .exists(),
        "a segment in /dev/shm too"
    );
    assert_eq!(list_names(), vec![name.clone()]);
    let job = JobClient::join(&name, &JobOptions::default()).unwrap();
    assert!(job.connected());
    assert_eq!(SegmentView::open(&name).unwrap().jobs().len(), 1);
    drop(job);
    drop(coordinator);
    assert!(!path.exists(), "the segment was not removed");
    std::fs::remove_dir_all(&dir).unwrap();
}
