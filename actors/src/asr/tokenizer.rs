//! Whisper's token vocabulary: byte-level BPE tokens back to text, and the special tokens.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::ModelError;

/// Reads the token list of a CTranslate2 model directory: `vocabulary.json` (a JSON array of
/// strings, as newer converters write it) or `vocabulary.txt` (one token per line). The index
/// of a token is its id.
pub fn read_vocabulary(model_dir: &Path) -> Result<(PathBuf, Vec<String>), ModelError> {
    let json = model_dir.join("vocabulary.json");
    let (path, text) = match std::fs::read_to_string(&json) {
        Ok(text) => (json, text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let txt = model_dir.join("vocabulary.txt");
            match std::fs::read_to_string(&txt) {
                Ok(text) => return Ok((txt, text.lines().map(str::to_owned).collect())),
                Err(source) => return Err(ModelError::Io { path: txt, source }),
            }
        }
        Err(source) => return Err(ModelError::Io { path: json, source }),
    };
    let tokens: Vec<String> = serde_json::from_str(&text).map_err(|e| ModelError::Invalid {
        path: path.clone(),
        reason: format!("not a JSON array of token strings: {e}"),
    })?;
    Ok((path, tokens))
}

/// The vocabulary of a CTranslate2 Whisper model (`vocabulary.json` or `vocabulary.txt`).
#[derive(Debug, Clone)]
pub struct Vocabulary {
    tokens: Vec<String>,
    ids: HashMap<String, usize>,
    byte_of: HashMap<char, u8>,
    /// `<|endoftext|>`: ids from here on are special (not text).
    pub eot: usize,
}

/// GPT-2's map from bytes to printable characters, inverted.
fn unicode_to_bytes() -> HashMap<char, u8> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..256 {
        let c = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        map.insert(
            char::from_u32(c).expect("code points below 0x200 are valid"),
            b as u8,
        );
    }
    map
}

impl Vocabulary {
    /// Reads the vocabulary of a model directory (see [`read_vocabulary`]).
    pub fn load(model_dir: &Path) -> Result<Self, ModelError> {
        let (path, tokens) = read_vocabulary(model_dir)?;
        let ids: HashMap<String, usize> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i))
            .collect();
        let eot = *ids
            .get("<|endoftext|>")
            .ok_or_else(|| ModelError::Invalid {
                path,
                reason: "no <|endoftext|> token".into(),
            })?;
        Ok(Self {
            tokens,
            ids,
            byte_of: unicode_to_bytes(),
            eot,
        })
    }

    /// The id of a token string.
    pub fn id(&self, token: &str) -> Option<usize> {
        self.ids.get(token).copied()
    }

    /// The token string of an id.
    pub fn token(&self, id: usize) -> Option<&str> {
        self.tokens.get(id).map(String::as_str)
    }

    /// Whether `id` is a text token (not a special or timestamp token).
    pub fn is_text(&self, id: usize) -> bool {
        id < self.eot
    }

    /// The raw bytes of one token.
    pub fn token_bytes(&self, id: usize, out: &mut Vec<u8>) {
        if let Some(token) = self.token(id) {
            out.extend(token.chars().filter_map(|c| self.byte_of.get(&c)));
        }
    }

    /// Decodes text tokens to a string; special tokens are skipped, invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[usize]) -> String {
        let mut bytes = Vec::new();
        for &id in ids.iter().filter(|&&id| self.is_text(id)) {
            self.token_bytes(id, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let map = unicode_to_bytes();
        assert_eq!(map.len(), 256);
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'!'], b'!');
    }

    #[test]
    fn decodes_byte_level_tokens() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vocabulary.txt"),
            "Hello\nĠworld\nĠcaf\nÃ©\n<|endoftext|>\n<|notimestamps|>\n",
        )
        .unwrap();
        let v = Vocabulary::load(dir.path()).unwrap();
        assert_eq!(v.eot, 4);
        assert_eq!(v.decode(&[0, 1, 5]), "Hello world");
        assert_eq!(v.decode(&[2, 3]), " café");
        assert_eq!(v.id("<|notimestamps|>"), Some(5));
    }

    #[test]
    fn reads_a_json_vocabulary_first() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("vocabulary.json"),
            r#"["Hello", "\u0120world", "<|endoftext|>"]"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("vocabulary.txt"), "other\n").unwrap();
        let v = Vocabulary::load(dir.path()).unwrap();
        assert_eq!(v.eot, 2);
        assert_eq!(v.decode(&[0, 1]), "Hello world");
        std::fs::write(dir.path().join("vocabulary.json"), "{}").unwrap();
        assert!(matches!(
            Vocabulary::load(dir.path()),
            Err(ModelError::Invalid { .. })
        ));
    }
}
