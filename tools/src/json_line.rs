//! One JSON object per line over TCP: the out-of-band exchange of `xroce file` and of
//! `xroce mr-check` (which speaks the lab's `lab-mr.py` format), plus the hex helpers
//! both use for GIDs and digests.

use std::io::{Read, Write};

use crate::setup::{is_timeout, peer_hint};

/// Longest line accepted from a peer: a hello is a few hundred bytes.
const MAX_LINE: usize = 64 * 1024;

/// Writes `value` as one JSON line and flushes.
pub fn send_json<S: Write, T: serde::Serialize>(stream: &mut S, value: &T) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    stream.flush()?;
    Ok(())
}

/// Reads one JSON line (byte by byte, so nothing after the newline is consumed) and parses
/// it. `what` names the message in errors.
pub fn recv_json<S: Read, T: serde::de::DeserializeOwned>(
    stream: &mut S,
    what: &str,
) -> anyhow::Result<T> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = match stream.read(&mut byte) {
            Ok(n) => n,
            // The stream's reads are bounded during set-up: a peer that runs another tool
            // (or a client that says nothing) ends here instead of holding us forever.
            Err(e) if is_timeout(&e) => anyhow::bail!(
                "the peer sent no {what} in time ({} bytes, no complete line){}",
                line.len(),
                silent_or_hint(&line)
            ),
            Err(e) => anyhow::bail!("reading {what} from the peer: {e}"),
        };
        if n == 0 {
            anyhow::bail!("peer closed the connection before sending {what}");
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > MAX_LINE {
            anyhow::bail!(
                "{what} from peer is longer than {MAX_LINE} bytes{}",
                silent_or_hint(&line)
            );
        }
    }
    serde_json::from_slice(&line)
        .map_err(|e| anyhow::anyhow!("malformed {what} from peer: {e}{}", peer_hint(&line)))
}

/// What a failed read can say of the peer: which tool its bytes look like, or that it said
/// nothing at all.
fn silent_or_hint(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        "; the peer connected but sent nothing".into()
    } else {
        peer_hint(bytes)
    }
}

/// Lower-case hex of `bytes` (GIDs, SHA-256 digests).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A GID as 32 hex digits (how the JSON exchanges carry it).
pub fn gid_hex(gid: &[u8; 16]) -> String {
    hex(gid)
}

/// Parses 32 hex digits into a GID.
pub fn gid_from_hex(text: &str) -> anyhow::Result<[u8; 16]> {
    let bytes = text.as_bytes();
    if bytes.len() != 32 || !bytes.iter().all(u8::is_ascii_hexdigit) {
        anyhow::bail!("peer GID {text:?} is not 32 hex digits");
    }
    let mut gid = [0u8; 16];
    for (i, pair) in bytes.chunks(2).enumerate() {
        // Both characters are ASCII hex digits (checked above), so this cannot fail.
        let s = std::str::from_utf8(pair)?;
        gid[i] = u8::from_str_radix(s, 16)?;
    }
    Ok(gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_round_trip_and_rejects() {
        let gid: [u8; 16] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(gid_from_hex(&gid_hex(&gid)).unwrap(), gid);
        assert!(gid_from_hex("00").is_err());
        assert!(gid_from_hex(&"g".repeat(32)).is_err());
        assert!(gid_from_hex(&"+1".repeat(16)).is_err());
    }

    #[test]
    fn lines_round_trip_and_errors_are_typed() {
        let mut buf = Vec::new();
        send_json(&mut buf, &serde_json::json!({"op": "done"})).unwrap();
        assert_eq!(buf, b"{\"op\":\"done\"}\n");
        // Python's json.dumps puts spaces after separators; that must parse too.
        let mut r = &b"{\"qpn\": 17, \"psn\": 5}\nrest"[..];
        let v: serde_json::Value = recv_json(&mut r, "hello").unwrap();
        assert_eq!(v["qpn"], 17);
        assert_eq!(r, b"rest");
        let e = recv_json::<_, serde_json::Value>(&mut &b"{\"qpn\""[..], "hello").unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
        let e = recv_json::<_, serde_json::Value>(&mut &b"nope\n"[..], "hello").unwrap_err();
        assert!(e.to_string().contains("malformed hello"), "{e}");
    }
}
