//! Workload: several streams, stream-ordered allocation (`cuMemAllocAsync`, pools), the
//! `cuLaunchKernelEx` and `extra` launch forms, a struct-of-pointers kernel (`gather4`),
//! async copies and memsets, events across streams, and every kind of host wait.
//!
//! `wl_streams <lookup>` (see `tensile_tests::driver::Lookup::parse`).

use tensile_tests::driver::Lookup;
use tensile_tests::session::{kernel, Arg, Form, Session};

fn main() {
    let lookup = std::env::args()
        .nth(1)
        .and_then(|a| Lookup::parse(&a))
        .expect("usage: wl_streams <lookup>");
    let s = Session::start(lookup);
    let ks = s.kernels(true);
    let (s1, s2) = (s.stream(), s.stream());
    let null = std::ptr::null_mut();
    let n: u64 = 3000;
    let bytes = (n * 4) as usize;
    let pool = s.pool();

    // Four sources filled on two streams with the two non-default launch forms.
    let srcs: Vec<u64> = (0..4)
        .map(|i| {
            let (st, form) = if i % 2 == 0 {
                (s1, Form::Ex)
            } else {
                (s2, Form::Extra)
            };
            let p = if i < 2 {
                s.alloc_async(bytes, st)
            } else {
                s.alloc_from_pool(bytes, pool, st)
            };
            s.launch(
                kernel(&ks, "fill_pattern"),
                3,
                128,
                st,
                &[Arg::ptr(p), Arg::U64(n), Arg::U32(10 + i)],
                form,
            );
            p
        })
        .collect();
    // s1 waits for s2's fills, then gathers the four into dst through a by-value struct.
    let filled = s.record_event(s2);
    s.wait_event(s1, filled);
    let dst = s.alloc_async(bytes, s1);
    let mut st = Vec::with_capacity(48);
    for p in &srcs {
        st.extend_from_slice(&p.to_le_bytes());
    }
    st.extend_from_slice(&dst.to_le_bytes());
    st.extend_from_slice(&n.to_le_bytes());
    let pointers = vec![
        (0, srcs[0]),
        (8, srcs[1]),
        (16, srcs[2]),
        (24, srcs[3]),
        (32, dst),
    ];
    for form in [Form::Params, Form::Extra, Form::Ex] {
        s.launch(
            kernel(&ks, "gather4"),
            2,
            256,
            s1,
            &[Arg::Struct {
                bytes: st.clone(),
                pointers: pointers.clone(),
            }],
            form,
        );
    }

    // Async copies and memsets on s2, ordered after s1's work.
    let gathered = s.record_event(s1);
    s.wait_event(s2, gathered);
    let copy = s.alloc_async(bytes, s2);
    s.copy_dtod((copy, copy), (dst, dst), bytes, Some(s2));
    s.memset(copy, 1, 0x5a, 100, Some(s2));
    s.memset_at((copy + 400, copy), 4, 0xdead_beef, 100, Some(s2));
    let host: Vec<u8> = (0..256u32).map(|i| (i * 3) as u8).collect();
    s.upload_at((copy + 1024, copy), &host, Some(s2));
    s.copy_any(srcs[0], copy, bytes, Some(s2));
    let back = s.download(copy, bytes, Some(s2));
    s.say(format!(
        "D copy_async {:016x}",
        tensile_tests::expect::fnv1a(&back)
    ));

    // The legacy default stream and the per-thread one (null handle).
    let sum = s.alloc(8);
    s.memset(sum, 4, 0, 2, None);
    s.launch(
        kernel(&ks, "checksum"),
        2,
        128,
        null,
        &[Arg::ptr(dst), Arg::U64(n), Arg::ptr(sum)],
        Form::Ex,
    );
    let done = s.record_event(null);
    s.sync_event(done);
    s.digest("gather_checksum", sum, 8);
    s.sync_stream(s1);
    s.sync_stream(null);

    for (i, p) in srcs.iter().enumerate() {
        s.digest(&format!("src{i}"), *p, bytes);
    }
    s.digest("dst", dst, bytes);
    for p in &srcs[..2] {
        s.free_async(*p, s1);
    }
    for p in &srcs[2..] {
        s.free_async(*p, s2);
    }
    s.free_async(dst, s1);
    s.free_async(copy, s2);
    s.free(sum);
    s.sync_ctx();
    s.say("done");
}
