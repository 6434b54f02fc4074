//! A bulk spool file (`NAME.jsonl`): its lines (`bulk_lines::lines`) and each line's batch
//! (`parse_line`). Lines come in order, each slice is where its offset says, an invalid
//! line's error names its line, a valid one prints back to the same batch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost::batch;
use roost::intake::bulk_lines::{self, Limits};

const LIMITS: Limits = Limits {
    lines_max: 100,
    line_bytes_max: 512,
    batch_ops_max: 1000,
};

/// The line a JSON error's position names: serde's messages end "at line N column M"
/// (a client's own text quoted earlier in the message may say anything).
fn json_error_line(error: &str) -> Option<u64> {
    let tail = &error[error.rfind(" at line ")? + " at line ".len()..];
    let (line, column) = tail.split_once(" column ")?;
    column.parse::<u64>().ok()?;
    line.parse().ok()
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let Ok(lines) = bulk_lines::lines(data, &LIMITS) else {
        return;
    };
    for w in lines.windows(2) {
        assert!(w[0].number < w[1].number && w[0].offset < w[1].offset);
    }
    for l in &lines {
        let at = l.offset as usize;
        assert_eq!(&data[at..at + l.bytes.len()], l.bytes);
        assert!(l.number <= LIMITS.lines_max);
        match bulk_lines::parse_line(l, &LIMITS) {
            Err(inv) => {
                if let Some(n) = json_error_line(&inv.error) {
                    assert_eq!(n, l.number, "line {}: {}", l.number, inv.error);
                }
            }
            Ok(b) => {
                let again = batch::parse(&b.to_json(), LIMITS.batch_ops_max)
                    .expect("a bulk line's batch printed back parses");
                assert_eq!(again, b);
            }
        }
    }
    let _ = bulk_lines::same_key_before(&lines, &LIMITS);
});
