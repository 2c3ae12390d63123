//! Reading a new user's password without putting it on the command line (where `ps` and the
//! shell's history would show it): from standard input with `--password-stdin`, from
//! `CALLSTREAM_USER_PASSWORD`, or typed at a terminal prompt that does not echo it.

use std::io::{BufRead, IsTerminal, Write};

/// The password: the first line of standard input when `from_stdin`, else `from_env` when
/// set, else asked for twice at the terminal.
pub fn read(from_stdin: bool, from_env: Option<String>) -> anyhow::Result<String> {
    if from_stdin {
        return first_line(&mut std::io::stdin().lock());
    }
    if let Some(password) = from_env.filter(|p| !p.is_empty()) {
        return Ok(password);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        anyhow::bail!(
            "no password given: pass --password-stdin and write it to standard input, set \
             CALLSTREAM_USER_PASSWORD, or run at a terminal to be asked"
        );
    }
    let first = prompt("Password: ")?;
    let again = prompt("Password again: ")?;
    anyhow::ensure!(first == again, "the two passwords differ");
    Ok(first)
}

/// The first line of `input`, without its line ending.
fn first_line(input: &mut dyn BufRead) -> anyhow::Result<String> {
    let mut line = String::new();
    input.read_line(&mut line)?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    anyhow::ensure!(!password.is_empty(), "standard input held no password");
    Ok(password)
}

/// Asks for a line at the terminal with echo off.
fn prompt(question: &str) -> anyhow::Result<String> {
    eprint!("{question}");
    std::io::stderr().flush()?;
    let echo = EchoOff::new();
    let answer = first_line(&mut std::io::stdin().lock());
    drop(echo);
    eprintln!();
    answer
}

/// Turns the terminal's echo off on standard input until dropped.
struct EchoOff(Option<libc::termios>);

impl EchoOff {
    fn new() -> Self {
        // SAFETY: termios is plain data; tcgetattr fills it or fails, and on failure the
        // terminal is left as it is.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut saved) != 0 {
                return Self(None);
            }
            let mut quiet = saved;
            quiet.c_lflag &= !libc::ECHO;
            quiet.c_lflag |= libc::ECHONL;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) != 0 {
                return Self(None);
            }
            Self(Some(saved))
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &saved);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_the_password() {
        let mut input = std::io::Cursor::new(b"a long password\r\nnext".to_vec());
        assert_eq!(first_line(&mut input).unwrap(), "a long password");
        assert!(first_line(&mut std::io::Cursor::new(b"\n".to_vec())).is_err());
        assert_eq!(
            read(false, Some("from the environment".into())).unwrap(),
            "from the environment"
        );
    }
}
