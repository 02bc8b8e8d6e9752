//! Running a program with a time limit, as the suites run `kubectl`, `helm` and friends: a call
//! that hangs (an API server that stopped answering, a FIFO nobody reads) is killed and fails the
//! test naming what it waited for, instead of holding the run until CI's own limit.

use std::io::{Read, Write as _};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The longest any one call of `kubectl`, `helm` (its `--wait` included), `grpcurl` or `up
/// --restart` may take in the suites.
pub const CALL_LIMIT: Duration = Duration::from_secs(600);

/// [`output_within`] as a method: `cmd.args(..).output_within(CALL_LIMIT)` where the suites had
/// `.output()`.
pub trait OutputWithin {
    fn output_within(&mut self, limit: Duration) -> Result<Output, String>;
}

impl OutputWithin for Command {
    fn output_within(&mut self, limit: Duration) -> Result<Output, String> {
        output_within(self, None, limit)
    }
}

/// `cmd`'s output, with `stdin` written to it; killed, and an error naming the command, when it
/// has not exited within `limit`.
pub fn output_within(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    limit: Duration,
) -> Result<Output, String> {
    let what = describe(cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("{what}: {e}"))?;
    // Writer and readers on threads of their own: a child blocked on a full pipe must not block us.
    let writer = match (stdin, child.stdin.take()) {
        (Some(text), Some(mut pipe)) => {
            let text = text.to_vec();
            Some(thread::spawn(move || {
                let _ = pipe.write_all(&text);
            }))
        }
        _ => None,
    };
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: no answer within {limit:?} (killed)"));
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// `program arg arg...`, as a message names it.
fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_answers_gives_its_output() {
        let out = output_within(
            Command::new("cat").arg("-"),
            Some(b"hello"),
            Duration::from_secs(10),
        )
        .expect("cat answers");
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hello");
    }

    #[test]
    fn a_program_that_hangs_is_killed_and_named() {
        let started = Instant::now();
        let err = output_within(
            Command::new("sleep").arg("30"),
            None,
            Duration::from_millis(300),
        )
        .expect_err("sleep 30 outlives 300 ms");
        assert!(err.starts_with("sleep 30: no answer within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "it was killed");
    }
}
