//! The stream socket's request lines: framed by `next_line` (never holding more than the
//! line limit) and each parsed by `parse_line`. Framing is checked against a plain split on
//! newlines; every error names its stream line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost::intake::stream_protocol::{next_line, parse_line, Line};

const LINE_BYTES_MAX: usize = 256;

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    // The first byte picks the reader's buffer size: lines cut across fills in any place.
    let (c, bytes) = roost_fuzz::choice(data);
    let mut r = tokio::io::BufReader::with_capacity(usize::from(c % 64) + 1, bytes);
    let mut expect = bytes.split(|b| *b == b'\n').peekable();
    let mut n = 0u64;
    while let Some(line) = roost_fuzz::ready(next_line(&mut r, LINE_BYTES_MAX)).expect("reading a slice") {
        n += 1;
        let want = expect.next().expect("a line the split does not have");
        match &line {
            Line::Bytes(b) => assert_eq!(b.as_slice(), want),
            Line::TooLong { bytes } => {
                assert!(want.len() > LINE_BYTES_MAX);
                assert_eq!(*bytes, want.len() as u64);
            }
        }
        if let Err(inv) = parse_line(&line, n, LINE_BYTES_MAX, 1000) {
            assert!(inv.error.starts_with(&format!("stream line {n}: ")), "{}", inv.error);
        }
    }
    // What the split has left is at most the empty piece after a final newline.
    let rest: Vec<&[u8]> = expect.collect();
    assert!(rest.is_empty() || rest == [b"" as &[u8]], "lines left unread: {rest:?}");
});
