//! The follower's pure pieces: the truncation and the records check.
use super::*;

fn e(lsn: Lsn, epoch: Epoch) -> Entry {
    Entry {
        lsn,
        epoch,
        kind: 0,
        payload: vec![],
    }
}

/// A follower whose records all belong to epochs after the leader's diverging epoch has
/// no epoch to look up: Kafka's rule truncates to min(leader end, log end), which here
/// would not shorten the log, so the follower stops instead of asking forever.
#[test]
fn a_truncation_that_cannot_shorten_the_log_is_stuck() {
    let log = crate::testing::MemLog::new("f");
    log.seed(&[(3, b"x"), (3, b"y")]);
    assert!(matches!(
        truncate(&log, 1, 5),
        Err(Trunc::Stuck { log_end: 3 })
    ));
    assert!(matches!(
        truncate(&log, 3, 2),
        Ok(Truncation {
            truncate_to: 2,
            complete: true
        })
    ));
    assert_eq!(FollowerLog::log_end(&log), 2);
}

#[test]
fn check_records_table() {
    let sent = Sent {
        current_epoch: 3,
        fetch_lsn: 5,
        last_epoch: 2,
    };
    let ok: &[&[Entry]] = &[&[], &[e(5, 2)], &[e(5, 2), e(6, 3)]];
    for entries in ok {
        assert!(check_records(sent, 3, entries).is_ok(), "{entries:?}");
    }
    let bad: &[&[Entry]] = &[
        &[e(6, 2)],
        &[e(5, 1)],
        &[e(5, 4)],
        &[e(5, 3), e(6, 2)],
        &[e(5, 3), e(7, 3)],
    ];
    for entries in bad {
        assert!(check_records(sent, 3, entries).is_err(), "{entries:?}");
    }
}
