//! Where in a JSON document a partial answer has got to, as a JSON Pointer (RFC 6901): the
//! point whose odds an answer reports is named by the value being written there
//! (`/budget/status`, `/intents/0/intent`), not by how many such points came before it.

/// One open container of the document so far.
enum Open {
    /// An object: the key of the member being written (`None` until its key is read).
    Object(Option<String>),
    /// An array: the index of the element being written.
    Array(usize),
}

/// The JSON Pointer of the value that `prefix` (the start of a JSON document) is writing at
/// its end: inside a string value just opened, or where a value is about to start. Keys are
/// unescaped as JSON reads them and escaped as RFC 6901 writes them (`~0`, `~1`).
pub fn pointer_at_end(prefix: &str) -> String {
    let mut open: Vec<Open> = Vec::new();
    // The string being read: its text so far, and whether it is a key.
    let mut string: Option<(String, bool)> = None;
    let mut chars = prefix.chars();
    while let Some(c) = chars.next() {
        if let Some((text, _)) = string.as_mut() {
            match c {
                '"' => {
                    let (text, is_key) = string.take().unwrap_or_default();
                    if is_key {
                        if let Some(Open::Object(key)) = open.last_mut() {
                            *key = Some(text);
                        }
                    }
                }
                '\\' => match chars.next() {
                    Some('n') => text.push('\n'),
                    Some('t') => text.push('\t'),
                    Some('r') => text.push('\r'),
                    Some('b') => text.push('\u{8}'),
                    Some('f') => text.push('\u{c}'),
                    Some('u') => {
                        let hex: String = chars.by_ref().take(4).collect();
                        let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                        text.push(ch.unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                    Some(other) => text.push(other),
                    None => {}
                },
                other => text.push(other),
            }
            continue;
        }
        match c {
            '{' => open.push(Open::Object(None)),
            '[' => open.push(Open::Array(0)),
            '}' | ']' => {
                open.pop();
            }
            ',' => match open.last_mut() {
                Some(Open::Array(index)) => *index += 1,
                Some(Open::Object(key)) => *key = None,
                None => {}
            },
            '"' => {
                let is_key = matches!(open.last(), Some(Open::Object(None)));
                string = Some((String::new(), is_key));
            }
            _ => {}
        }
    }
    let mut pointer = String::new();
    for container in &open {
        pointer.push('/');
        match container {
            Open::Object(Some(key)) => pointer.push_str(&key.replace('~', "~0").replace('/', "~1")),
            Open::Object(None) => {}
            Open::Array(index) => pointer.push_str(&index.to_string()),
        }
    }
    pointer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pointer_names_the_value_being_written() {
        assert_eq!(pointer_at_end(r#"{"budget":{"status":""#), "/budget/status");
        assert_eq!(
            pointer_at_end(
                r#"{"budget":{"status":"identified","evidence":["a, \"b\"}"],"x":1},"need":{"status":""#
            ),
            "/need/status"
        );
        assert_eq!(
            pointer_at_end(
                r#"{"intents":[{"intent":"billing_inquiry","confidence":"high"},{"intent":""#
            ),
            "/intents/1/intent"
        );
        assert_eq!(pointer_at_end(r#"{"topic":""#), "/topic");
        // Keys are read as JSON writes them, and written as a pointer escapes them.
        assert_eq!(pointer_at_end(r#"{"a\/b~c\u0041":""#), "/a~1b~0cA");
        // Brackets and commas inside strings are text.
        assert_eq!(pointer_at_end(r#"{"s":"[{,","list":[1,[2,3],"#), "/list/2");
        assert_eq!(pointer_at_end(""), "");
    }
}
