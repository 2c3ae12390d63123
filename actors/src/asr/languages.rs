//! The language codes a loaded Whisper model accepts.
//!
//! The answer comes from the model files, not from a list we maintain: a CTranslate2 Whisper
//! directory carries `config.json` (with `lang_ids`, the token ids of the language tokens) and
//! its vocabulary (`vocabulary.json` or `vocabulary.txt`; a token's index is its id). An English-only model
//! (`*.en`) has a vocabulary one token shorter than a multilingual one and keeps the language
//! tokens only as unused leftovers, so for it the list is just `en`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Size of the multilingual Whisper vocabulary; English-only models have one token fewer.
const MULTILINGUAL_VOCAB_SIZE: usize = 51_865;

/// One language the speech model accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Language {
    /// The model's code, as in Whisper's language tokens (`en`, `de`, `yue`...).
    pub code: String,
    /// English name of the language.
    pub name: String,
    /// BCP-47 tags (`language-REGION`) that name it, the usual one first (`en-US`, `en-GB`...).
    pub tags: Vec<String>,
}

/// Finds the model language a caller means by `tag_or_code`: a model code (`en`, `yue`), a
/// BCP-47 tag (`en-US`, `es_mx`, any case; any region of the language), or a primary subtag
/// whose ISO 639-1 code differs from Whisper's (`jv` for Whisper's `jw`, `nb` for `no`, `iw`
/// for `he`, `fil` for `tl`).
pub fn resolve<'a>(languages: &'a [Language], tag_or_code: &str) -> Option<&'a Language> {
    let wanted = tag_or_code.trim().replace('_', "-");
    if wanted.is_empty() {
        return None;
    }
    if let Some(l) = languages.iter().find(|l| {
        l.code.eq_ignore_ascii_case(&wanted)
            || l.tags.iter().any(|t| t.eq_ignore_ascii_case(&wanted))
    }) {
        return Some(l);
    }
    let primary = wanted.split('-').next()?.to_ascii_lowercase();
    let code = ALIASES
        .iter()
        .find(|(alias, _)| *alias == primary)
        .map_or(primary.as_str(), |(_, code)| code);
    languages.iter().find(|l| l.code == code)
}

/// Every BCP-47 tag of `languages`, in order: what AudioHook's `supportedLanguages` lists.
pub fn supported_tags(languages: &[Language]) -> Vec<String> {
    languages
        .iter()
        .flat_map(|l| l.tags.iter().cloned())
        .collect()
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
    let (vocab_path, tokens) = super::tokenizer::read_vocabulary(model_dir)?;
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

/// The language of a model code, with its name and tags.
pub fn language(code: &str) -> Language {
    let name = NAMES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(code, |(_, name)| name);
    let tags = TAGS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, tags)| tags.iter().map(|t| (*t).to_owned()).collect())
        .unwrap_or_default();
    Language {
        code: code.to_owned(),
        name: name.to_owned(),
        tags,
    }
}

/// Primary subtags callers use whose Whisper code differs.
const ALIASES: &[(&str, &str)] = &[
    ("jv", "jw"),
    ("nb", "no"),
    ("iw", "he"),
    ("in", "id"),
    ("ji", "yi"),
    ("fil", "tl"),
    ("cmn", "zh"),
];

/// BCP-47 tags of Whisper's languages, the usual one first. Each has the shape AudioHook
/// clients check (`^[a-z]{2,3}-[A-Za-z]{2,3}$`).
#[rustfmt::skip]
const TAGS: &[(&str, &[&str])] = &[
    ("en", &["en-US", "en-GB", "en-AU", "en-CA", "en-IN", "en-IE", "en-NZ", "en-ZA", "en-PH", "en-SG"]),
    ("zh", &["zh-CN", "zh-TW", "zh-HK", "zh-SG"]), ("de", &["de-DE", "de-AT", "de-CH"]),
    ("es", &["es-ES", "es-MX", "es-US", "es-AR", "es-CO", "es-CL", "es-PE"]),
    ("ru", &["ru-RU"]), ("ko", &["ko-KR"]), ("fr", &["fr-FR", "fr-CA", "fr-BE", "fr-CH"]),
    ("ja", &["ja-JP"]), ("pt", &["pt-BR", "pt-PT"]), ("tr", &["tr-TR"]), ("pl", &["pl-PL"]),
    ("ca", &["ca-ES"]), ("nl", &["nl-NL", "nl-BE"]), ("ar", &["ar-SA", "ar-AE", "ar-EG", "ar-MA"]),
    ("sv", &["sv-SE"]), ("it", &["it-IT", "it-CH"]), ("id", &["id-ID"]), ("hi", &["hi-IN"]),
    ("fi", &["fi-FI"]), ("vi", &["vi-VN"]), ("he", &["he-IL"]), ("uk", &["uk-UA"]),
    ("el", &["el-GR"]), ("ms", &["ms-MY"]), ("cs", &["cs-CZ"]), ("ro", &["ro-RO"]),
    ("da", &["da-DK"]), ("hu", &["hu-HU"]), ("ta", &["ta-IN"]), ("no", &["no-NO", "nb-NO"]),
    ("th", &["th-TH"]), ("ur", &["ur-PK"]), ("hr", &["hr-HR"]), ("bg", &["bg-BG"]),
    ("lt", &["lt-LT"]), ("la", &["la-VA"]), ("mi", &["mi-NZ"]), ("ml", &["ml-IN"]),
    ("cy", &["cy-GB"]), ("sk", &["sk-SK"]), ("te", &["te-IN"]), ("fa", &["fa-IR"]),
    ("lv", &["lv-LV"]), ("bn", &["bn-BD", "bn-IN"]), ("sr", &["sr-RS"]), ("az", &["az-AZ"]),
    ("sl", &["sl-SI"]), ("kn", &["kn-IN"]), ("et", &["et-EE"]), ("mk", &["mk-MK"]),
    ("br", &["br-FR"]), ("eu", &["eu-ES"]), ("is", &["is-IS"]), ("hy", &["hy-AM"]),
    ("ne", &["ne-NP"]), ("mn", &["mn-MN"]), ("bs", &["bs-BA"]), ("kk", &["kk-KZ"]),
    ("sq", &["sq-AL"]), ("sw", &["sw-KE", "sw-TZ"]), ("gl", &["gl-ES"]), ("mr", &["mr-IN"]),
    ("pa", &["pa-IN"]), ("si", &["si-LK"]), ("km", &["km-KH"]), ("sn", &["sn-ZW"]),
    ("yo", &["yo-NG"]), ("so", &["so-SO"]), ("af", &["af-ZA"]), ("oc", &["oc-FR"]),
    ("ka", &["ka-GE"]), ("be", &["be-BY"]), ("tg", &["tg-TJ"]), ("sd", &["sd-PK"]),
    ("gu", &["gu-IN"]), ("am", &["am-ET"]), ("yi", &["yi-US"]), ("lo", &["lo-LA"]),
    ("uz", &["uz-UZ"]), ("fo", &["fo-FO"]), ("ht", &["ht-HT"]), ("ps", &["ps-AF"]),
    ("tk", &["tk-TM"]), ("nn", &["nn-NO"]), ("mt", &["mt-MT"]), ("sa", &["sa-IN"]),
    ("lb", &["lb-LU"]), ("my", &["my-MM"]), ("bo", &["bo-CN"]), ("tl", &["tl-PH", "fil-PH"]),
    ("mg", &["mg-MG"]), ("as", &["as-IN"]), ("tt", &["tt-RU"]), ("haw", &["haw-US"]),
    ("ln", &["ln-CD"]), ("ha", &["ha-NG"]), ("ba", &["ba-RU"]), ("jw", &["jv-ID"]),
    ("su", &["su-ID"]), ("yue", &["yue-HK"]),
];

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
    fn every_language_has_tags_of_the_audiohook_shape() {
        let shape = |t: &str| {
            let Some((lang, region)) = t.split_once('-') else {
                return false;
            };
            (2..=3).contains(&lang.len())
                && lang.bytes().all(|b| b.is_ascii_lowercase())
                && (2..=3).contains(&region.len())
                && region.bytes().all(|b| b.is_ascii_alphabetic())
        };
        assert_eq!(TAGS.len(), NAMES.len());
        for (code, _) in NAMES {
            let l = language(code);
            assert!(!l.tags.is_empty(), "{code} has no tags");
            assert!(l.tags.iter().all(|t| shape(t)), "{:?}", l.tags);
            // Each tag leads back to its language.
            let all = [l.clone()];
            for t in &l.tags {
                assert_eq!(resolve(&all, t).map(|l| l.code.as_str()), Some(*code));
            }
        }
    }

    #[test]
    fn tags_and_codes_resolve_to_model_languages() {
        let languages: Vec<Language> = ["en", "de", "es", "jw", "no"].map(language).to_vec();
        let code = |t: &str| resolve(&languages, t).map(|l| l.code.clone());
        assert_eq!(code("en-US").as_deref(), Some("en"));
        assert_eq!(code("en").as_deref(), Some("en"));
        assert_eq!(code("EN-gb").as_deref(), Some("en"));
        assert_eq!(code("DE_at").as_deref(), Some("de"));
        assert_eq!(code("es-419").as_deref(), Some("es"));
        assert_eq!(code("jv-ID").as_deref(), Some("jw"));
        assert_eq!(code("nb-NO").as_deref(), Some("no"));
        assert_eq!(code("fr-FR"), None);
        assert_eq!(code(""), None);
        assert_eq!(code("-"), None);
        let tags = supported_tags(&languages);
        assert_eq!(&tags[..2], ["en-US", "en-GB"]);
        assert!(tags.contains(&"es-MX".to_owned()));
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
