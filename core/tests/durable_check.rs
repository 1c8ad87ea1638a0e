//! The crash check of `bench ... --crash-check`: after a power failure and
//! the log replay, every file a dbench Flush acknowledged is found with its
//! bytes; and the check is not blind: a file that lost acknowledged bytes,
//! or its name, is reported.

mod common;

use btrkit_core::io::BlockDevice;
use btrkit_core::log::batch::SharedFs;
use btrkit_core::workload::dbench::{parse_loadfile, run_with, verify_durable, DbenchOptions};
use common::*;
use std::sync::Arc;

/// Two files written and flushed, one written more after its Flush, one
/// written and never flushed, one flushed and then unlinked.
const LOAD: &str = r#"Mkdir "\clients\client1" NT_STATUS_OK
NTCreateX "\clients\client1\a" 0x0 0x2 1 NT_STATUS_OK
WriteX 1 0 20000 20000 NT_STATUS_OK
Flush 1 NT_STATUS_OK
WriteX 1 20000 5000 5000 NT_STATUS_OK
NTCreateX "\clients\client1\b" 0x0 0x2 2 NT_STATUS_OK
WriteX 2 4096 8192 8192 NT_STATUS_OK
Flush 2 NT_STATUS_OK
NTCreateX "\clients\client1\c" 0x0 0x2 3 NT_STATUS_OK
WriteX 3 0 3000 3000 NT_STATUS_OK
NTCreateX "\clients\client1\d" 0x0 0x2 4 NT_STATUS_OK
WriteX 4 0 3000 3000 NT_STATUS_OK
Flush 4 NT_STATUS_OK
Close 4 NT_STATUS_OK
Unlink "\clients\client1\d" NT_STATUS_OK
"#;

#[test]
fn acknowledged_files_survive_and_a_loss_is_reported() {
    let dev = new_image(256 << 20, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let fs = mount(base, &[]).unwrap();
    let shared = SharedFs::new(fs);
    let load = parse_loadfile(LOAD).unwrap();
    let o = DbenchOptions {
        clients: 2,
        time: 0.0,
        passes: 1,
        warmup: 0.0,
    };
    let (r, tracked) = run_with(&shared, &load, &o, true).unwrap();
    assert_eq!(r.unexpected, 0, "{:?}", r.unexpected_examples);
    let fs = shared.into_inner();

    // Power failure: only what was flushed survives; then the log replay.
    let crashed: Arc<dyn BlockDevice> = Arc::new(dev.crash_device(|_| false));
    drop(fs);
    let mut after = mount(crashed.clone(), &[]).unwrap();
    let v = verify_durable(&mut after, &tracked).unwrap();
    // a, b (acknowledged) and c (never) per client; d was unlinked.
    assert_eq!((v.checked, v.checked_acknowledged), (6, 4), "{v:?}");
    assert!(v.ok(), "{v:?}");

    // Not blind: acknowledged bytes overwritten, and a name gone.
    let a = after.resolve("/clients/client1/a", false).unwrap();
    after.write(a, 100, b"not what was written").unwrap();
    let dir = after.resolve("/clients/client2", false).unwrap();
    after.unlink(dir, b"b").unwrap();
    let v = verify_durable(&mut after, &tracked).unwrap();
    assert_eq!(v.lost, 2, "{v:?}");
    assert!(
        v.examples
            .iter()
            .any(|e| e.contains("client1/a") && e.contains("differ")),
        "{:?}",
        v.examples
    );
    assert!(
        v.examples
            .iter()
            .any(|e| e.contains("client2/b") && e.contains("missing")),
        "{:?}",
        v.examples
    );
}
