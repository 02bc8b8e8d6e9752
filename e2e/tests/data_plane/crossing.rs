//! Crossing the rendezvous as nobody may: another fabric, no uid, a slow loris, a flood of
//! connects and of members (the a-side's `crossing` section, b2's `b2-peaks`).

use serde_json::{Value, json};

use super::runs;

/// The JSON after `PREFIX` on a line of `out`.
fn json_after(out: &str, prefix: &str) -> Value {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line:\n{out}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{prefix} {line}: {e}"))
}

/// The owner's refusal in a `rocefabric-dsm-crossing hello` answer.
fn refusal(answer: &Value) -> String {
    let text = answer["answer"].as_str().unwrap_or_default();
    let reply: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("answer {text:?}: {e}"));
    reply["refuse"]
        .as_str()
        .unwrap_or_else(|| panic!("not a refusal: {reply}"))
        .to_string()
}

#[test]
fn nobody_else_crosses_the_rendezvous_and_its_caps_hold_under_a_flood() {
    let Some((a, b)) = runs("nobody_else_crosses_the_rendezvous_and_its_caps_hold_under_a_flood")
    else {
        return;
    };
    let s = a.section("crossing");
    let out = &s.output;
    assert_eq!(s.rc, 0, "{out}");
    let other = refusal(&json_after(out, "other fabric: "));
    assert!(
        other.contains(r#"fabric "other" (this pod is in "dsm")"#),
        "{other}"
    );
    let no_uid = refusal(&json_after(out, "no uid: "));
    assert!(
        no_uid.contains("the hello names no uid for pod b2"),
        "{no_uid}"
    );
    // The owner names both causes too, with where they came from.
    let b2 = b.section("b2").output;
    for why in [r#"fabric "other""#, "the hello names no uid"] {
        assert!(
            b2.lines()
                .any(|l| l.contains("10.88.1.9") && l.contains(why)),
            "b2 does not log {why}:\n{b2}"
        );
    }
    // A slow loris is cut off at the handshake deadline; a member was served meanwhile.
    let time = |prefix: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{out}"))
    };
    let (served, cut) = (time("member served at "), time("loris answered at "));
    assert!(served < cut, "a member waited for the loris:\n{out}");
    let loris = out
        .lines()
        .find(|l| l.starts_with("loris answered at "))
        .unwrap_or_default();
    assert!(
        loris.contains("no full line within the deadline"),
        "{loris}"
    );
    // 1,000 silent connects from 12 addresses: at most b2's cap (ROCEFABRIC_DSM_MAX_PEERS=64) get
    // a slot at once, to be cut off at the deadline; every other is refused at once, saying which
    // cap.
    let flood = json_after(out, "flood: ");
    let n = |k: &str| {
        flood[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {flood}"))
    };
    assert_eq!(flood["other"], json!([]), "{flood}");
    assert_eq!(
        n("capped") + n("cappedPerSource") + n("cutOff"),
        1000,
        "{flood}"
    );
    assert!(n("capped") > 0, "{flood}");
    // 40 members from one address at once: at most 32 (the cap per source) are admitted.
    let members = json_after(out, "members: ");
    let admitted = members["admitted"].as_u64().unwrap_or_default();
    let refused = members["refused"].as_array().cloned().unwrap_or_default();
    assert!((24..=32).contains(&admitted), "{members}");
    assert_eq!(admitted + refused.len() as u64, 40, "{members}");
    assert!(
        refused.iter().all(|r| r
            .as_str()
            .is_some_and(|r| r.contains("10.88.1.2 already (its cap per source)"))),
        "{members}"
    );
    assert!(out.contains("b2's window: unchanged"), "{out}");
    // b2's own threads and queue pairs, sampled while all that ran: never past the caps.
    let peaks = b.section("b2-peaks").output;
    let field = |k: &str| -> u64 {
        let mut w = peaks.split_whitespace();
        w.find(|x| *x == k);
        w.next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {peaks}"))
    };
    assert!(field("samples") > 100, "{peaks}");
    // The cap's 64 peer threads, the main and accept threads and the runtime's few.
    assert!(field("threads") <= 64 + 16, "{peaks}");
    // The members' 32 at most, and b2's own few as an initiator; the sampler saw the members.
    let qps = field("queue-pairs");
    assert!((24..=32 + 8).contains(&qps), "{peaks}");
    eprintln!(
        "data_plane: crossing: flood {flood}; members admitted {admitted} of 40; b2 peaks: {}",
        peaks.trim()
    );
}
