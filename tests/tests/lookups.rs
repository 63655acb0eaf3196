//! What libtensile answers when a real CUDA runtime asks `cuGetProcAddress`: every look-up
//! libcudart 13.5 makes at initialization (driver-abi/tests/data), asked through
//! `cuGetProcAddress_v2` and `cuGetProcAddress` under `LD_PRELOAD`. The result codes must be
//! the driver's; a successful answer must be libtensile's wrapper exactly for the managed
//! versioned symbol, and the driver's own function otherwise.

use std::collections::HashMap;

use tensile_driver_abi::{resolve_proc, ProcLookup};
use tensile_shim::Sym;
use tensile_tests::harness::Run;

const LOOKUPS: &str = env!("CARGO_BIN_EXE_wl_lookups");

fn data_file() -> String {
    format!(
        "{}/../driver-abi/tests/data/cudart-13.5-driver-lookups.txt",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `(form, name, version, flags)`.
type Question = (String, String, String, String);
/// `(result, status, library, same-as-dlsym)`.
type Answer = (String, String, String, String);

fn answers(stdout: &str) -> HashMap<Question, Answer> {
    stdout
        .lines()
        .filter(|l| l.starts_with("L "))
        .map(|l| {
            let f: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            assert_eq!(f.len(), 9, "{l}");
            (
                (f[1].clone(), f[2].clone(), f[3].clone(), f[4].clone()),
                (f[5].clone(), f[6].clone(), f[7].clone(), f[8].clone()),
            )
        })
        .collect()
}

#[test]
fn cudart_lookups_are_answered_correctly_under_the_shim() {
    let plain = Run::new(LOOKUPS).arg(data_file()).output();
    plain.assert_ok("wl_lookups without the shim");
    let shim = Run::new(LOOKUPS).arg(data_file()).preload(true).output();
    shim.assert_ok("wl_lookups under the shim");
    // The dlsym override keeps glibc's caller-relative RTLD_NEXT.
    assert!(
        plain.stdout.contains("N dlsym libc.so.6"),
        "{}",
        plain.stdout.lines().next().unwrap_or("")
    );
    assert!(
        shim.stdout.contains("N dlsym libtensile.so"),
        "{}",
        shim.stdout.lines().next().unwrap_or("")
    );
    let (plain, shim) = (answers(&plain.stdout), answers(&shim.stdout));
    assert!(plain.len() > 400, "only {} answers", plain.len());
    assert_eq!(plain.len(), shim.len());
    let (mut wrapped, mut passed, mut failed) = (0, 0, 0);
    for (key, (code, status, lib, same)) in &shim {
        let (pcode, pstatus, plib, psame) = &plain[key];
        assert_eq!(
            (code, status),
            (pcode, pstatus),
            "{key:?}: result differs under the shim"
        );
        if code != "0" {
            assert_eq!((lib.as_str(), same.as_str()), ("-", "-"), "{key:?}");
            failed += 1;
            continue;
        }
        let (_, name, version, flags) = key;
        let ProcLookup::Found(entry) =
            resolve_proc(name, version.parse().unwrap(), flags.parse().unwrap())
        else {
            panic!("{key:?} succeeded but the table does not resolve it");
        };
        assert!(
            plib.starts_with("libcuda"),
            "{key:?}: without the shim from {plib}"
        );
        assert_eq!(
            psame, "1",
            "{key:?}: the simulated driver's answer is not its {}",
            entry.symbol
        );
        // Under the shim `dlsym` on the driver handle gives the wrapper for managed symbols
        // too, so the answer must agree with it either way.
        assert_eq!(
            same, "1",
            "{key:?}: cuGetProcAddress and dlsym disagree under the shim"
        );
        if Sym::from_name(entry.symbol.as_bytes()).is_some() {
            assert_eq!(
                lib, "libtensile.so",
                "{key:?}: {} not wrapped",
                entry.symbol
            );
            wrapped += 1;
        } else {
            assert_eq!(
                lib, plib,
                "{key:?}: the unmanaged {} was changed",
                entry.symbol
            );
            passed += 1;
        }
    }
    // libcudart asks for every managed family, with and without the per-thread flag.
    assert!(
        wrapped >= 60,
        "only {wrapped} answers wrapped ({passed} passed through, {failed} failed)"
    );
    assert!(passed >= 100, "only {passed} answers passed through");
}
