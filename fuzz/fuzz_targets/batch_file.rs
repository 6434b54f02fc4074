//! A spool batch file (`batch::parse`): any bytes give a batch or an `Invalid`, never a
//! panic; a batch printed back (`Batch::to_json`, what a standby forwards) parses to the
//! same batch with the same fingerprint.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost::batch;

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let Ok(b) = batch::parse(data, 1000) else {
        return;
    };
    assert!(!b.request_key.is_empty() && !b.ops.is_empty());
    assert!(b.ops.len() <= 1000, "{} ops past batch_ops_max", b.ops.len());
    let again = batch::parse(&b.to_json(), 1000).expect("a parsed batch printed back parses");
    assert_eq!(again, b);
    assert_eq!(batch::fingerprint(&again), batch::fingerprint(&b));
});
