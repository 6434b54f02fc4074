//! The shard transaction frame (`frame::probe`, `probe_live`): any bytes give a verified
//! frame or a reason, never a panic; a verified frame's ops are within it, and rebuilt as a
//! `Txn` and encoded they probe to the same ops. Structured input (`arbitrary`): any `Txn`
//! encoded probes back to itself.
#![no_main]

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use roost_shards::frame::{self, OP_CREATE};
use roost_shards::{Txn, TxnOp};
use roost_storage::recovery::Seen;

/// The `Txn` a verified frame holds.
fn txn_of(buf: &[u8], v: &frame::FrameView) -> Txn {
    let ops = v
        .ops
        .iter()
        .map(|o| {
            assert!(o.record_offset + o.record_len <= v.len);
            if o.kind == OP_CREATE {
                let record = buf[o.record_offset..o.record_offset + o.record_len].to_vec();
                TxnOp::Create { id: o.id, record }
            } else {
                TxnOp::Delete { id: o.id }
            }
        })
        .collect();
    Txn { lsn: v.lsn, ops }
}

fn arbitrary_txn(u: &mut Unstructured<'_>) -> arbitrary::Result<Txn> {
    let lsn = u.arbitrary()?;
    let ops = u
        .arbitrary_iter::<(bool, u64, Vec<u8>)>()?
        .map(|op| {
            op.map(|(create, id, record)| match create {
                true => TxnOp::Create { id, record },
                false => TxnOp::Delete { id },
            })
        })
        .collect::<arbitrary::Result<Vec<_>>>()?;
    Ok(Txn { lsn, ops })
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    if c & 1 == 0 {
        if let Ok(t) = arbitrary_txn(&mut Unstructured::new(bytes)) {
            let f = frame::encode(&t);
            assert_eq!(f.len(), frame::encoded_len(&t));
            let (seen, v) = frame::probe(&f);
            assert_eq!(seen, Seen::Valid);
            let v = v.expect("an encoded frame verifies");
            assert_eq!(txn_of(&f, &v), t);
        }
        return;
    }
    let _ = frame::probe_live(bytes);
    let (seen, v) = frame::probe(bytes);
    let Ok(v) = v else {
        assert_ne!(seen, Seen::Valid);
        return;
    };
    assert!(v.len <= bytes.len());
    let t = txn_of(bytes, &v);
    let again = frame::encode(&t);
    let v2 = frame::probe(&again).1.expect("a re-encoded frame verifies");
    assert_eq!(txn_of(&again, &v2), t);
});
