//! The calls of [`Etcd`], one per gateway endpoint: build the JSON (`wire`), `call`, decode
//! and check what the call relies on (a header revision, one answer per txn op, a range
//! within its limit). A decoding failure names the endpoint that answered.

use serde_json::Value;

use crate::client::{Answer, Etcd};
use crate::error::EtcdError;
use crate::types::{Kv, Lease, Op, OpResponse, Txn, TxnResponse};
use crate::wire::{self, Header, KeepAliveJson, LeaseJson, RangeJson, ResponseOpJson};

/// The most keys [`Etcd::get_prefix`] returns: a range holding more is refused (as
/// `Malformed`), never cut short silently. An election prefix holds a key per member.
pub const PREFIX_KVS_MAX: usize = 1024;

impl Etcd {
    async fn post(&self, op: &'static str, path: &str, body: Value) -> Result<Answer, EtcdError> {
        self.call(op, path, body.to_string().into_bytes()).await
    }

    /// Grants a lease of `ttl_secs` (etcd raises it to its minimum TTL if below).
    pub async fn grant(&self, ttl_secs: i64) -> Result<Lease, EtcdError> {
        const OP: &str = "grant";
        let a = self
            .post(OP, "/v3/lease/grant", wire::grant(ttl_secs))
            .await?;
        decode_grant(&a)
    }

    /// Renews lease `id` once: `Some(ttl)` renewed for `ttl` seconds; `None` if etcd does not
    /// know it (expired or revoked: the gateway's answer has no TTL).
    pub async fn keepalive(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        const OP: &str = "keepalive";
        let a = self
            .post(OP, "/v3/lease/keepalive", wire::lease_id(id))
            .await?;
        decode_keepalive(a)
    }

    /// Revokes lease `id`, deleting the keys attached to it; a lease etcd does not know
    /// (expired, revoked already) is not an error.
    pub async fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        match self
            .post("revoke", "/v3/lease/revoke", wire::lease_id(id))
            .await
        {
            Ok(_) => Ok(()),
            Err(EtcdError::Status {
                code: 404, body, ..
            }) if body.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The seconds left on lease `id`; `None` if etcd does not know it (the gateway answers
    /// TTL -1).
    pub async fn time_to_live(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        const OP: &str = "timetolive";
        let a = self
            .post(OP, "/v3/lease/timetolive", wire::lease_id(id))
            .await?;
        decode_time_to_live(&a)
    }

    /// `key`'s pair, if it exists, and the store's revision when it was read.
    pub async fn get(&self, key: &str) -> Result<(Option<Kv>, i64), EtcdError> {
        let body = wire::range(key.as_bytes(), None, None);
        let (kvs, revision) = self.range("get", body, 1).await?;
        Ok((kvs.into_iter().next(), revision))
    }

    /// Every pair whose key starts with `prefix`, in key order, and the read's revision; at
    /// most [`PREFIX_KVS_MAX`] (more is an error).
    pub async fn get_prefix(&self, prefix: &str) -> Result<(Vec<Kv>, i64), EtcdError> {
        let end = wire::prefix_end(prefix.as_bytes());
        let body = wire::range(prefix.as_bytes(), Some(&end), Some(PREFIX_KVS_MAX as i64));
        self.range("get_prefix", body, PREFIX_KVS_MAX).await
    }

    /// A range of at most `kvs_max` pairs (`more` set, or more pairs, is an error).
    async fn range(
        &self,
        op: &'static str,
        body: Value,
        kvs_max: usize,
    ) -> Result<(Vec<Kv>, i64), EtcdError> {
        let a = self.post(op, "/v3/kv/range", body).await?;
        decode_range(&a, op, kvs_max)
    }

    /// Writes `key` (attached to `lease`, if given); the revision of the write.
    pub async fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> Result<i64, EtcdError> {
        const OP: &str = "put";
        let a = self
            .post(OP, "/v3/kv/put", wire::put(key, value, lease))
            .await?;
        decode_put(&a)
    }

    /// Deletes `key`; how many keys were deleted (0 or 1).
    pub async fn delete(&self, key: &str) -> Result<i64, EtcdError> {
        const OP: &str = "delete";
        let a = self
            .post(OP, "/v3/kv/deleterange", wire::delete(key))
            .await?;
        decode_delete(&a)
    }

    /// Runs `txn` atomically; which branch ran, the revision after it, and one answer per
    /// op of that branch.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, EtcdError> {
        const OP: &str = "txn";
        let a = self.post(OP, "/v3/kv/txn", wire::txn(&txn)).await?;
        decode_txn(&a, &txn)
    }
}

/// A grant's answer: the lease, or why there is none.
fn decode_grant(a: &Answer) -> Result<Lease, EtcdError> {
    const OP: &str = "grant";
    let r: LeaseJson = a.parse(OP)?;
    if !r.error.is_empty() {
        return Err(a.malformed(OP, format!("grant refused: {}", r.error)));
    }
    if r.id == 0 || r.ttl <= 0 {
        let detail = format!("no lease in the answer (ID {}, TTL {})", r.id, r.ttl);
        return Err(a.malformed(OP, detail));
    }
    Ok(Lease {
        id: r.id,
        ttl_secs: r.ttl,
    })
}

/// A keepalive's answer: `Some(ttl)` renewed, `None` unknown to etcd.
fn decode_keepalive(a: Answer) -> Result<Option<i64>, EtcdError> {
    const OP: &str = "keepalive";
    let r: KeepAliveJson = a.parse(OP)?;
    if let Some(e) = r.error {
        return Err(EtcdError::Status {
            endpoint: a.endpoint,
            op: OP,
            code: e.http_code.unwrap_or(500),
            body: e.message,
        });
    }
    let Some(result) = r.result else {
        return Err(a.malformed(OP, "neither result nor error in the answer"));
    };
    Ok((result.ttl > 0).then_some(result.ttl))
}

fn decode_time_to_live(a: &Answer) -> Result<Option<i64>, EtcdError> {
    let r: LeaseJson = a.parse("timetolive")?;
    Ok((r.ttl >= 0).then_some(r.ttl))
}

/// A range's answer: at most `kvs_max` pairs (`more` set, or more pairs, is an error).
fn decode_range(a: &Answer, op: &'static str, kvs_max: usize) -> Result<(Vec<Kv>, i64), EtcdError> {
    let r: RangeJson = a.parse(op)?;
    if r.more || r.kvs.len() > kvs_max {
        let detail = format!("more than {kvs_max} keys in the range");
        return Err(a.malformed(op, detail));
    }
    let revision = revision(a, op, r.header)?;
    let kvs = wire::decode_kvs(r.kvs).map_err(|d| a.malformed(op, d))?;
    Ok((kvs, revision))
}

fn decode_put(a: &Answer) -> Result<i64, EtcdError> {
    let r: wire::PutJson = a.parse("put")?;
    revision(a, "put", r.header)
}

fn decode_delete(a: &Answer) -> Result<i64, EtcdError> {
    let r: wire::DeleteJson = a.parse("delete")?;
    revision(a, "delete", r.header)?;
    Ok(r.deleted)
}

/// A txn's answer: which branch ran, the revision, one answer per op of that branch.
fn decode_txn(a: &Answer, txn: &Txn) -> Result<TxnResponse, EtcdError> {
    const OP: &str = "txn";
    let r: wire::TxnJson = a.parse(OP)?;
    let revision = revision(a, OP, r.header)?;
    let ops = if r.succeeded {
        &txn.success
    } else {
        &txn.failure
    };
    if r.responses.len() != ops.len() {
        let detail = format!("{} answers to {} ops", r.responses.len(), ops.len());
        return Err(a.malformed(OP, detail));
    }
    let responses = ops
        .iter()
        .zip(r.responses)
        .map(|(op, resp)| op_response(op, resp).map_err(|d| a.malformed(OP, d)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(TxnResponse {
        succeeded: r.succeeded,
        revision,
        responses,
    })
}

/// The gateway's answer `body` to `call` (`grant`, `keepalive`, `timetolive`, `get`,
/// `get_prefix`, `put`, `delete`, or `txn` to `txn`) decoded as that call decodes it,
/// printed: the fuzz target's way in (issue 45), never used by the client itself.
#[doc(hidden)]
pub fn decode_answer(call: &str, body: &[u8], txn: &Txn) -> Result<String, EtcdError> {
    let a = Answer {
        endpoint: "fuzz".into(),
        body: body.to_vec().into(),
    };
    Ok(match call {
        "grant" => format!("{:?}", decode_grant(&a)?),
        "keepalive" => format!("{:?}", decode_keepalive(a)?),
        "timetolive" => format!("{:?}", decode_time_to_live(&a)?),
        "get" => format!("{:?}", decode_range(&a, "get", 1)?),
        "get_prefix" => format!("{:?}", decode_range(&a, "get_prefix", PREFIX_KVS_MAX)?),
        "put" => format!("{:?}", decode_put(&a)?),
        "delete" => format!("{:?}", decode_delete(&a)?),
        _ => format!("{:?}", decode_txn(&a, txn)?),
    })
}

/// The header's revision, which every answer carries (a revision of 0 cannot be: a new
/// store starts at 1).
fn revision(a: &Answer, op: &'static str, header: Option<Header>) -> Result<i64, EtcdError> {
    match header {
        Some(h) if h.revision > 0 => Ok(h.revision),
        Some(h) => Err(a.malformed(op, format!("header revision {}", h.revision))),
        None => Err(a.malformed(op, "no header in the answer")),
    }
}

/// The answer to `op`, which must be of `op`'s kind.
fn op_response(op: &Op, resp: ResponseOpJson) -> Result<OpResponse, String> {
    match (op, resp) {
        (
            Op::Get { .. },
            ResponseOpJson {
                response_range: Some(r),
                ..
            },
        ) => {
            if r.more {
                return Err("a single-key read answered more".into());
            }
            Ok(OpResponse::Range(wire::decode_kvs(r.kvs)?))
        }
        (
            Op::Put { .. },
            ResponseOpJson {
                response_put: Some(_),
                ..
            },
        ) => Ok(OpResponse::Put),
        (
            Op::Delete { .. },
            ResponseOpJson {
                response_delete_range: Some(d),
                ..
            },
        ) => Ok(OpResponse::Delete { deleted: d.deleted }),
        (op, resp) => Err(format!("answer {resp:?} does not match op {op:?}")),
    }
}
