//! The language codes a loaded Whisper model accepts.
//!
//! The answer comes from the model files, not from a list we maintain: a CTranslate2 Whisper
//! directory carries `config.json` (with `lang_ids`, the token ids of the language tokens) and
//! `vocabulary.txt` (one token per line, the line number is the id). An English-only model
//! (`*.en`) has a vocabulary one token shorter than a multilingual one and keeps the language
//! tokens only as unused leftovers, so for it the list is just `en`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Size of the multilingual Whisper vocabulary; English-only models have one token fewer.
const MULTILINGUAL_VOCAB_SIZE: usize = 51_865;

/// One language the speech model accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Language {
    /// The code callers send, as in Whisper's language tokens (`en`, `de`, `yue`...).
    pub code: String,
    /// English name of the language.
    pub name: String,
}

/// Errors reading a model directory.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file of the model could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file of the model is not what a CTranslate2 Whisper model holds.
    #[error("{path} is not a CTranslate2 Whisper model file: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

#[derive(Deserialize)]
struct WhisperConfig {
    #[serde(default)]
    lang_ids: Vec<usize>,
}

/// Lists the languages the Whisper model in `model_dir` accepts.
pub fn model_languages(model_dir: &Path) -> Result<Vec<Language>, ModelError> {
    let vocab_path = model_dir.join("vocabulary.txt");
    let vocab = read(&vocab_path)?;
    let tokens: Vec<&str> = vocab.lines().collect();
    if tokens.len() < MULTILINGUAL_VOCAB_SIZE - 1 {
        return Err(ModelError::Invalid {
            path: vocab_path,
            reason: format!(
                "{} tokens, a Whisper vocabulary has at least 51864",
                tokens.len()
            ),
        });
    }
    if tokens.len() < MULTILINGUAL_VOCAB_SIZE {
        return Ok(vec![language("en")]);
    }

    let config_path = model_dir.join("config.json");
    let config: WhisperConfig =
        serde_json::from_str(&read(&config_path)?).map_err(|e| ModelError::Invalid {
            path: config_path.clone(),
            reason: e.to_string(),
        })?;
    config
        .lang_ids
        .iter()
        .map(|&id| {
            tokens
                .get(id)
                .and_then(|t| t.strip_prefix("<|")?.strip_suffix("|>"))
                .map(language)
                .ok_or_else(|| ModelError::Invalid {
                    path: config_path.clone(),
                    reason: format!("lang_ids names token {id}, which is not a language token"),
                })
        })
        .collect()
}

fn read(path: &Path) -> Result<String, ModelError> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_owned(),
        source,
    })
}

fn language(code: &str) -> Language {
    let name = NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(code, |(_, name)| name);
    Language {
        code: code.to_owned(),
        name: name.to_owned(),
    }
}

/// English names of Whisper's language codes.
#[rustfmt::skip]
const NAMES: &[(&str, &str)] = &[
    ("en", "English"), ("zh", "Chinese"), ("de", "German"), ("es", "Spanish"),
    ("ru", "Russian"), ("ko", "Korean"), ("fr", "French"), ("ja", "Japanese"),
    ("pt", "Portuguese"), ("tr", "Turkish"), ("pl", "Polish"), ("ca", "Catalan"),
    ("nl", "Dutch"), ("ar", "Arabic"), ("sv", "Swedish"), ("it", "Italian"),
    ("id", "Indonesian"), ("hi", "Hindi"), ("fi", "Finnish"), ("vi", "Vietnamese"),
    ("he", "Hebrew"), ("uk", "Ukrainian"), ("el", "Greek"), ("ms", "Malay"),
    ("cs", "Czech"), ("ro", "Romanian"), ("da", "Danish"), ("hu", "Hungarian"),
    ("ta", "Tamil"), ("no", "Norwegian"), ("th", "Thai"), ("ur", "Urdu"),
    ("hr", "Croatian"), ("bg", "Bulgarian"), ("lt", "Lithuanian"), ("la", "Latin"),
    ("mi", "Maori"), ("ml", "Malayalam"), ("cy", "Welsh"), ("sk", "Slovak"),
    ("te", "Telugu"), ("fa", "Persian"), ("lv", "Latvian"), ("bn", "Bengali"),
    ("sr", "Serbian"), ("az", "Azerbaijani"), ("sl", "Slovenian"), ("kn", "Kannada"),
    ("et", "Estonian"), ("mk", "Macedonian"), ("br", "Breton"), ("eu", "Basque"),
    ("is", "Icelandic"), ("hy", "Armenian"), ("ne", "Nepali"), ("mn", "Mongolian"),
    ("bs", "Bosnian"), ("kk", "Kazakh"), ("sq", "Albanian"), ("sw", "Swahili"),
    ("gl", "Galician"), ("mr", "Marathi"), ("pa", "Punjabi"), ("si", "Sinhala"),
    ("km", "Khmer"), ("sn", "Shona"), ("yo", "Yoruba"), ("so", "Somali"),
    ("af", "Afrikaans"), ("oc", "Occitan"), ("ka", "Georgian"), ("be", "Belarusian"),
    ("tg", "Tajik"), ("sd", "Sindhi"), ("gu", "Gujarati"), ("am", "Amharic"),
    ("yi", "Yiddish"), ("lo", "Lao"), ("uz", "Uzbek"), ("fo", "Faroese"),
    ("ht", "Haitian Creole"), ("ps", "Pashto"), ("tk", "Turkmen"), ("nn", "Nynorsk"),
    ("mt", "Maltese"), ("sa", "Sanskrit"), ("lb", "Luxembourgish"), ("my", "Myanmar"),
    ("bo", "Tibetan"), ("tl", "Tagalog"), ("mg", "Malagasy"), ("as", "Assamese"),
    ("tt", "Tatar"), ("haw", "Hawaiian"), ("ln", "Lingala"), ("ha", "Hausa"),
    ("ba", "Bashkir"), ("jw", "Javanese"), ("su", "Sundanese"), ("yue", "Cantonese"),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a model directory with a vocabulary of `size` tokens whose language tokens sit
    /// where Whisper puts them, and a config naming three of them.
    fn model_dir(size: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut vocab: Vec<String> = (0..size).map(|i| format!("tok{i}")).collect();
        vocab[50259] = "<|en|>".into();
        vocab[50260] = "<|zh|>".into();
        vocab[50261] = "<|de|>".into();
        std::fs::write(dir.path().join("vocabulary.txt"), vocab.join("\n")).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"lang_ids":[50259,50260,50261],"suppress_ids":[]}"#,
        )
        .unwrap();
        dir
    }

    #[test]
    fn english_only_model_lists_english() {
        let dir = model_dir(51_864);
        let langs = model_languages(dir.path()).unwrap();
        assert_eq!(langs, vec![language("en")]);
        assert_eq!(langs[0].name, "English");
    }

    #[test]
    fn multilingual_model_lists_its_language_tokens() {
        let dir = model_dir(51_865);
        let codes: Vec<String> = model_languages(dir.path())
            .unwrap()
            .into_iter()
            .map(|l| l.code)
            .collect();
        assert_eq!(codes, ["en", "zh", "de"]);
    }

    #[test]
    fn lang_id_that_is_not_a_language_token_is_an_error() {
        let dir = model_dir(51_865);
        std::fs::write(dir.path().join("config.json"), r#"{"lang_ids":[5]}"#).unwrap();
        assert!(matches!(
            model_languages(dir.path()),
            Err(ModelError::Invalid { .. })
        ));
    }

    #[test]
    fn missing_model_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            model_languages(&dir.path().join("nope")),
            Err(ModelError::Io { .. })
        ));
    }
}
