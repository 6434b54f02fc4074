//! The one-pass parse against the old one: fixed cases, the daemon's test corpus, and
//! several thousand generated batches, valid and broken.

use super::super::{canon, fingerprint, missing_field, parse_at, BatchOp};

/// Runs both parses over `input`; panics on any difference.
fn same(input: &[u8], first_line: u64) {
    let old = super::parse_at(input, 10, first_line);
    let new = parse_at(input, 10, first_line);
    let show = || {
        String::from_utf8_lossy(input)
            .chars()
            .take(2_000)
            .collect::<String>()
    };
    match (old, new) {
        (Ok((old, fields)), Ok(new)) => {
            assert_eq!(old, new, "batches differ: {}", show());
            assert_eq!(fingerprint(&old), fingerprint(&new));
            let records = new.ops.iter().filter_map(|op| match op {
                BatchOp::Create { record, .. } => Some(record),
                BatchOp::Delete { .. } => None,
            });
            for (record, fields) in records.zip(&fields) {
                let keys = canon::top_level_keys(record);
                assert_eq!(&keys, fields, "keys of {}", show());
                assert_eq!(missing_field(record, fields), None);
                let absent = ["\u{0}absent".to_owned()];
                assert_eq!(missing_field(record, &absent), Some("\u{0}absent"));
            }
        }
        (Err(old), Err(new)) => assert_eq!(old, new, "refusals differ: {}", show()),
        (old, new) => panic!("old {old:?}, new {new:?}: {}", show()),
    }
}

/// Runs both parses over each of `inputs` and counts the accepted ones.
fn all_same<I: AsRef<[u8]>>(inputs: &[I]) -> usize {
    let mut ok = 0;
    for (i, input) in inputs.iter().enumerate() {
        same(input.as_ref(), 1 + (i as u64 % 3) * 6);
        ok += usize::from(parse_at(input.as_ref(), 10, 1).is_ok());
    }
    ok
}

/// Record values the brief names, and more of the same kinds.
const VALUES: &[&str] = &[
    "0",
    "-0",
    "-0.0",
    "0.0",
    "1.0",
    "1e2",
    "1E-7",
    "1e+2",
    "-1.5e-3",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "3.141592653589793238",
    "1e308",
    "2.2250738585072014e-308",
    "5e-324",
    "1e-400",
    "123456789012345678901234567890",
    "0.1",
    "100",
    "-100",
    "true",
    "false",
    "null",
    r#""""#,
    r#""\/""#,
    r#""a\u0041""#,
    r#""\ud83d\ude00""#,
    r#""😀""#,
    r#""\u00e9""#,
    r#""é""#,
    r#""\u0000\u001f\u007f\b\f\n\r\t""#,
    r#""\"\\""#,
    r#""\u2028\u2029""#,
    "[]",
    "{}",
    "[[]]",
    "[{}]",
    r#"{"":{}}"#,
    r#"[1,[2,[3]],{"b":1,"a":2}]"#,
];

/// Keys whose order differs between their bytes and their escaped spelling.
const KEYS: &[&str] = &[
    r#""b""#,
    r#""a""#,
    r#""B""#,
    r#""é""#,
    r#""😀""#,
    r#""\ud83d\ude01""#,
    r#""""#,
    r#""a\u0000""#,
    r#""\u0041a""#,
    r#""~""#,
    r#""aa""#,
    r#""a b""#,
    r#""\n""#,
    r#""\"""#,
];

/// Whole inputs: those of `rejects_what_it_must` and the other parse tests, and more.
const WHOLE: &[&[u8]] = &[
        b"", b"{", b"\xff\xfe", b" ", b"null", b"[1, 2, 3]", b"[]", br#"["k"]"#,
        br#"["k",[{"op":"delete","shard":"s","id":1}]]"#,
        br#"["k",[{"op":"delete","shard":"s","id":1}],3]"#,
        br#"["k",[{"op":"delete","shard":"s","id":1}],]"#,
        br#"{"request_key":"k","ops":[]}"#,
        br#"{"request_key":"","ops":[{"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":-1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":1.5}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"../x","id":1}]}"#,
        br#"{"request_key":"k","extra":1,"ops":[{"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","request_key":"j","ops":[{"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"a\u0001","ops":[{"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{"aA":1,"a\u0041":2}}]}"#,
        br#"{"ops":[{"record":{"b":1,"a":2},"shard":"s","op":"create"},{"id":4,"shard":"t","op":"delete"}],"request_key":"k"}"#,
        br#"{"request_key": "order-17", "ops": [{"op": "create", "shard": "users", "record": {"name": "ada"}}, {"op": "delete", "shard": "users", "id": 17}]}"#,
        br#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{"a":1,"a":2}}]} x"#,
        br#"{"request_key":"k","extra":{"a":1,"a":2},"ops":[]}"#,
        br#"{"request_key":"k","ops":[{"op":{"a":1,"a":2},"shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"x":{"a":1,"a":2},"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"x":1,"x":2,"op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":{"a":1,"a":2}}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":[1,{"a":1,"a":2}]}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":1,"id":1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","op":"delete","shard":"s","id":1}]}"#,
        br#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{},"record":{}}]}"#,
        br#"{"request_key":"k","ops":[{"op":"create","shard":"s","shard":"s","record":{}}]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":1}],"ops":[]}"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":1}],"ops":"#,
        br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","record":[1,"\x"]}]}"#,
        b"{\"request_key\":\"k\",\"ops\":[{\"op\":\"create\",\"shard\":\"s\",\"record\":{\"a\":\"\xff\"}}]}",
        b"{\"request_key\":\"k\",\"ops\":[{\"op\":\"create\",\"shard\":\"s\",\"record\":{\"a\":1}}]}\xff",
        b"{\"request_key\":\"k\",\"extra\":1,\"ops\":[{\"op\":\"create\",\"shard\":\"s\",\"record\":{\"\xc3\":1}}]}",
];

/// Op objects, each put in a batch of its own.
const OPS: &[&str] = &[
    r#"{"shard":"s","id":1}"#,
    r#"{"op":"update","shard":"s","id":1}"#,
    r#"{"op":"delete","id":1}"#,
    r#"{"op":"delete","shard":"s"}"#,
    r#"{"op":"create","shard":"s"}"#,
    r#"{"op":"delete","shard":"s","id":1,"force":true}"#,
    r#"{"force":true,"op":"create","shard":"s","record":{}}"#,
    r#"{"op":"create","shard":"s","record":{},"id":3}"#,
    r#"{"op":"delete","shard":"s","id":3,"record":{}}"#,
    r#"{"op":"create","shard":"s","record":[1]}"#,
    r#"{"op":"create","shard":"s","record":null}"#,
    r#"{"op":"create","shard":"s","record":"r\n"}"#,
    r#"{"op":"create","shard":"s","record":-2.5e-300}"#,
    r#"{"op":"create","shard":"s","record":7}"#,
    r#"{"op":"create","shard":"s","record":-7}"#,
    r#"{"op":"create","shard":"s","record":true}"#,
    r#"{"op":"delete","shard":"s","id":"7"}"#,
    r#"{"op":"delete","shard":"s","id":-3}"#,
    r#"{"op":"delete","shard":"s","id":1e30}"#,
    r#"{"op":"delete","shard":"s","id":null}"#,
    r#"{"op":"delete","shard":"s","id":[]}"#,
    r#"{"op":"delete","shard":"s","id":{}}"#,
    r#"{"op":"delete","shard":"s","id":18446744073709551615}"#,
    r#"{"op":1,"shard":"s","id":1}"#,
    r#"{"op":"delete","shard":["s"],"id":1}"#,
    r#""create""#,
    "7",
    "[]",
];

fn batch(record: &str) -> String {
    format!(r#"{{"request_key":"k","ops":[{{"op":"create","shard":"s","record":{record}}}]}}"#)
}

/// Goal: the record values the brief names, each alone and all together, parse to the
/// bytes the old parse gave.
#[test]
fn chosen_records_are_as_before() {
    let mut inputs: Vec<String> = VALUES
        .iter()
        .map(|v| batch(&format!(r#"{{"v":{v}}}"#)))
        .collect();
    let pairs: Vec<String> = VALUES
        .iter()
        .enumerate()
        .map(|(i, v)| format!(r#""k{:02}":{v}"#, VALUES.len() - i))
        .collect();
    inputs.push(batch(&format!("{{{}}}", pairs.join(","))));
    inputs.push(batch(&format!("{{ {} }}", pairs.join(" ,\n\t"))));
    let entries: Vec<String> = KEYS.iter().map(|k| format!("{k}:{{{k}:[{k}]}}")).collect();
    inputs.push(batch(&format!("{{{}}}", entries.join(","))));
    inputs.push(batch(r#"{"a":1,"b":{"y":[1,{"q":1,"p":2}],"x":2},"A":3}"#));
    inputs.push(batch(" \n{ \"b\" : 1 ,\t\"a\"\r: [ 1 , 2 ] }\n "));
    inputs.push(batch("1e400"));
    inputs.push(batch(r#"{"a":1e400}"#));
    assert_eq!(all_same(&inputs), inputs.len() - 2);
}

/// Goal: the cases of `rejects_what_it_must` and the other parse tests give what they gave.
#[test]
fn fixed_cases_are_as_before() {
    let mut inputs: Vec<Vec<u8>> = WHOLE.iter().map(|b| b.to_vec()).collect();
    inputs.extend(
        OPS.iter()
            .map(|op| format!(r#"{{"request_key":"k","ops":[{op}]}}"#).into_bytes()),
    );
    // Forty keys, past the short list of `Seen`, in two orders: f3 or f39 twice, or none.
    for twice in [r#""f3":0"#, r#""f20":0"#, r#""f39":0"#] {
        let mut fields: Vec<String> = (0..40).map(|i| format!(r#""f{i}":{i}"#)).collect();
        fields[20] = twice.to_owned();
        inputs.push(batch(&format!("{{{}}}", fields.join(","))).into_bytes());
        fields.reverse();
        inputs.push(batch(&format!("{{{}}}", fields.join(","))).into_bytes());
    }
    // Nesting: far past serde_json's limit, just past it, and at it.
    for depth in [100_000, 124, 123] {
        let nested = format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth), "]".repeat(depth));
        inputs.push(batch(&nested).into_bytes());
    }
    // Accepted: a batch as a sequence, one with its fields in any order, the documented
    // example, the largest id, forty distinct keys in two orders, the nesting at the limit.
    assert_eq!(all_same(&inputs), 7);
}

/// Goal: the daemon's corpus of batch files and bulk lines gives what it gave.
#[test]
fn the_test_corpus_is_as_before() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/tests/corpus");
    let mut inputs = Vec::new();
    for sub in [dir.clone(), dir.join("bulk")] {
        for entry in std::fs::read_dir(&sub).expect("the corpus") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                continue;
            }
            let bytes = std::fs::read(&path).expect("a corpus file");
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => inputs.push(bytes),
                Some("jsonl") => inputs.extend(bytes.split(|b| *b == b'\n').map(<[u8]>::to_vec)),
                _ => {}
            }
        }
    }
    assert!(inputs.len() > 40, "{}", inputs.len());
    assert!(all_same(&inputs) > 3);
}

/// Goal: thousands of generated batches, valid and broken every way the generator knows,
/// parse alike (the same batches, the same refusals).
#[test]
fn generated_batches_are_as_before() {
    let mut g = Gen(0x05ee_d0fb_47c4);
    let mut valid = Vec::new();
    let mut broken = Vec::new();
    for n in 0..3_000 {
        let doc = g.batch(None);
        broken.push(g.mutate(doc.as_bytes()));
        broken.push(g.mutate(doc.as_bytes()));
        if n % 4 == 0 {
            let level = *g.pick(&[Level::Top, Level::Op, Level::Record, Level::Nested]);
            broken.push(g.batch(Some(level)).into_bytes());
        }
        valid.push(doc);
    }
    let accepted = all_same(&valid);
    assert!(accepted > valid.len() / 2, "{accepted} of {}", valid.len());
    let accepted = all_same(&broken);
    assert!(
        accepted < broken.len() / 2,
        "{accepted} of {}",
        broken.len()
    );
}

/// Where a generated batch repeats a key.
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Top,
    Op,
    Record,
    Nested,
}

/// A deterministic generator (splitmix64) of batch text.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// Whitespace, mostly none.
    fn ws(&mut self) -> &'static str {
        const WS: &[&str] = &[" ", "\n", "\t", "\r\n", "  ", " \t "];
        if self.one_in(3) {
            WS[self.below(WS.len())]
        } else {
            ""
        }
    }

    /// A JSON string of `s`, each character written raw or escaped, as it falls.
    fn string(&mut self, s: &str) -> String {
        let mut out = String::from("\"");
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                _ => None,
            };
            let must = c == '"' || c == '\\' || c < ' ';
            match (self.below(3), short) {
                (0, Some(e)) => out.push_str(e),
                (1, _) => self.unicode_escape(&mut out, c),
                (_, Some(e)) if must => out.push_str(e),
                (_, None) if must => self.unicode_escape(&mut out, c),
                _ => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// `c` as `\uXXXX`, or a surrogate pair of them, in either case of hex digit.
    fn unicode_escape(&mut self, out: &mut String, c: char) {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            if self.one_in(2) {
                out.push_str(&format!("\\u{u:04X}"));
            } else {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }

    fn text(&mut self, max: usize) -> String {
        const CHARS: &[char] = &[
            'a',
            'b',
            'A',
            'B',
            'z',
            '0',
            ' ',
            '~',
            '"',
            '\\',
            '/',
            '\n',
            '\t',
            '\u{0}',
            '\u{1f}',
            '\u{7f}',
            'é',
            'ä',
            '€',
            '\u{2028}',
            '😀',
            '\u{10ffff}',
            '\u{fffd}',
        ];
        let n = self.below(max + 1);
        (0..n).map(|_| *self.pick(CHARS)).collect()
    }

    fn number(&mut self) -> String {
        const NUMBERS: &[&str] = &[
            "0",
            "-0",
            "-0.0",
            "1.0",
            "1e2",
            "1E-7",
            "1e+2",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "3.141592653589793238",
            "0.30000000000000004",
            "5e-324",
            "1.7976931348623157e308",
            "-1e-400",
            "99999999999999999999999",
            "-0e5",
            "0.5E0",
        ];
        match self.below(4) {
            0 => self.pick(NUMBERS).to_string(),
            1 => self.next().to_string(),
            2 => (self.next() as i64).to_string(),
            _ => {
                let (a, b) = (self.next() % 100_000, self.next() % 1_000_000);
                let e = self.below(80) as i64 - 40;
                format!("{}{a}.{b}e{e}", if self.one_in(2) { "-" } else { "" })
            }
        }
    }

    fn value(&mut self, depth: usize, dup: Option<Level>) -> String {
        match self.below(if depth >= 4 { 4 } else { 7 }) {
            0 => self.number(),
            1 => self.pick(&["true", "false", "null"]).to_string(),
            2 | 3 => {
                let t = self.text(6);
                self.string(&t)
            }
            4 => {
                let n = self.below(4);
                let items: Vec<String> = (0..n).map(|_| self.value(depth + 1, dup)).collect();
                let sep = format!("{},{}", self.ws(), self.ws());
                format!("[{}{}{}]", self.ws(), items.join(&sep), self.ws())
            }
            _ => self.object(depth + 1, dup == Some(Level::Nested), dup),
        }
    }

    /// An object of up to five entries of distinct keys (one repeated when `repeat`).
    fn object(&mut self, depth: usize, repeat: bool, dup: Option<Level>) -> String {
        let mut keys: Vec<String> = Vec::new();
        for _ in 0..self.below(6) {
            let k = self.text(3);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        if repeat && !keys.is_empty() {
            let k = self.pick(&keys).clone();
            keys.insert(self.below(keys.len() + 1), k);
        }
        let entries: Vec<(String, String)> = keys
            .iter()
            .map(|k| (self.string(k), self.value(depth, dup)))
            .collect();
        self.members(entries)
    }

    /// `{"k":v,..}` with whitespace here and there.
    fn members(&mut self, entries: Vec<(String, String)>) -> String {
        let mut out = format!("{{{}", self.ws());
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 {
                out.push_str(&format!("{},{}", self.ws(), self.ws()));
            }
            out.push_str(&format!("{k}{}:{}{v}", self.ws(), self.ws()));
        }
        out.push_str(&format!("{}}}", self.ws()));
        out
    }

    /// An op, its fields in any order; sometimes one too many or too few, or a bad value.
    fn op(&mut self, dup: Option<Level>) -> String {
        let create = self.one_in(2);
        let shards: &[&str] = if self.one_in(20) {
            &["../x", "S", ""]
        } else {
            &["s", "s0", "a_b-9"]
        };
        let shard = self.pick(shards).to_string();
        let op = if create { "create" } else { "delete" };
        let mut entries = vec![
            (self.string("op"), self.string(op)),
            (self.string("shard"), self.string(&shard)),
        ];
        let record = if self.one_in(20) {
            self.value(2, dup)
        } else {
            self.object(2, dup == Some(Level::Record), dup)
        };
        let id = if self.one_in(20) {
            self.value(2, dup)
        } else {
            (self.next() % 1000).to_string()
        };
        let (name, value) = if create {
            ("record", record)
        } else {
            ("id", id)
        };
        entries.push((self.string(name), value));
        if self.one_in(40) {
            entries.push((self.string("force"), self.value(2, dup)));
        }
        if self.one_in(40) {
            entries.remove(self.below(entries.len()));
        }
        if dup == Some(Level::Op) {
            let e = self.pick(&entries).clone();
            entries.insert(self.below(entries.len() + 1), e);
        }
        self.shuffle(&mut entries);
        self.members(entries)
    }

    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }

    /// A batch, as an object (in any order) or, now and then, as a sequence.
    fn batch(&mut self, dup: Option<Level>) -> String {
        let n = if self.one_in(30) {
            self.pick(&[0, 11]).to_owned()
        } else {
            1 + self.below(4)
        };
        let ops: Vec<String> = (0..n).map(|_| self.op(dup)).collect();
        let ops = format!(
            "[{}{}{}]",
            self.ws(),
            ops.join(&format!(",{}", self.ws())),
            self.ws()
        );
        let key = if self.one_in(10) {
            self.text(4)
        } else {
            format!("k-{}", self.next() % 100)
        };
        let key = self.string(&key);
        if self.one_in(30) {
            return format!("[{key},{ops}]");
        }
        let mut entries = vec![(self.string("request_key"), key), (self.string("ops"), ops)];
        if dup == Some(Level::Top) {
            let e = self.pick(&entries).clone();
            entries.push(e);
        }
        self.shuffle(&mut entries);
        format!("{}{}{}", self.ws(), self.members(entries), self.ws())
    }

    /// `doc` broken: cut short, something after it, a byte changed, added or taken out, or
    /// something bad put after one of its quotes (in a string, or just after one).
    fn mutate(&mut self, doc: &[u8]) -> Vec<u8> {
        const BYTES: &[u8] = b"{}[]\":,\\ 0-.eEax\xff\xc3\x80\x01";
        const BAD: &[&[u8]] = &[
            b"\\x",
            b"\\u12G4",
            b"\\ud800",
            b"\\udc00x",
            b"\\ud83d\\u0041",
            b"\x01",
            b"\xff",
            b"\xc3(",
            b"\xed\xa0\x80",
            b"\\",
            b"\"",
            b"\\u00",
            b"\n",
        ];
        const AFTER: &[&[u8]] = &[b" x", b"}", b",", b"]", b" \"a\"", b"\xff", b" {}"];
        let mut d = doc.to_vec();
        let at = self.below(d.len() + 1);
        match self.below(6) {
            0 => d.truncate(at),
            1 => d.extend_from_slice(AFTER[self.below(AFTER.len())]),
            2 if at < d.len() => d[at] = *self.pick(BYTES),
            3 => d.insert(at, *self.pick(BYTES)),
            4 if at < d.len() => {
                d.remove(at);
            }
            _ => {
                let quotes: Vec<usize> = (0..d.len()).filter(|i| d[*i] == b'"').collect();
                let at = quotes
                    .get(self.below(quotes.len().max(1)))
                    .map_or(0, |q| q + 1);
                let bad = *self.pick(BAD);
                d.splice(at..at, bad.iter().copied());
            }
        }
        d
    }
}
