//! The etcd gateway's JSON answers (`roost_etcd::decode_answer`: every call's decoding, as
//! the client runs it on a body it read, capped at `RESPONSE_BYTES_MAX`). Input: a choice
//! byte (which call; for a txn, which ops each branch holds), then the body. Properties: no
//! panic, and an error names the call it decoded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost_etcd::{decode_answer, EtcdError, Op, Txn};

const CALLS: [&str; 8] = [
    "grant",
    "keepalive",
    "timetolive",
    "get",
    "get_prefix",
    "put",
    "delete",
    "txn",
];

fn op(n: u8) -> Op {
    let key = "/roost/leader".to_owned();
    match n % 3 {
        0 => Op::Get { key },
        1 => Op::Put {
            key,
            value: b"n1".to_vec(),
            lease: Some(7),
        },
        _ => Op::Delete { key },
    }
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, body) = roost_fuzz::choice(data);
    let call = CALLS[usize::from(c % 8)];
    let txn = Txn {
        compare: Vec::new(),
        success: (0..(c >> 3) % 3).map(op).collect(),
        failure: (0..(c >> 5) % 3).map(|n| op(n + 1)).collect(),
    };
    match decode_answer(call, body, &txn) {
        Ok(_) => {}
        Err(EtcdError::Malformed { op, .. }) | Err(EtcdError::Status { op, .. }) => {
            assert_eq!(op, call, "the error names another call");
        }
        Err(e) => panic!("{call}: an error that is not the answer's: {e}"),
    }
});
