//! The skip rule of every integration test here: print `SKIP: <test>:
//! <reason>`, and fail instead when `BTRKIT_REQUIRE_ORACLES=1` (CI sets it,
//! since CI has btrfs-progs, root, loop devices and ../shared).

/// Print the skip line for the running test, or fail it when oracles are required.
pub fn skip(reason: &str) {
    let name = std::thread::current()
        .name()
        .unwrap_or("<unnamed>")
        .to_string();
    eprintln!("SKIP: {name}: {reason}");
    let required = std::env::var("BTRKIT_REQUIRE_ORACLES").is_ok_and(|v| !v.is_empty() && v != "0");
    assert!(
        !required,
        "BTRKIT_REQUIRE_ORACLES is set, so this test may not skip: {name}: {reason}"
    );
}
