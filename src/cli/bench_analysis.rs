//! `callstream bench analysis`: quality and speed of the intent, BANT and NEAT-P analyses.
//!
//! Quality is measured on a labelled set of calls (`fixtures/analysis/calls.txt` and the
//! recordings `build.py` made of it): each call is transcribed as `POST /api/transcribe` does
//! (or, with `--text`, its written dialogue is used) and analysed, and the answers are compared
//! with the labels. Speed is measured on a long call: the three analyses of its whole
//! transcript, and the intent analysis of a live call asked at intervals as its transcript
//! grows, with another call analysed in between each time.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use callstream::config::{Config, LlmProviderKind};
use callstream::files::seller_label;
use callstream::llm::profiles::{
    analyse_checked, messages, warm_ups, Analysis, Checked, Confidence, Layout, ProfileKind,
    FILE_LAYOUT, LIVE_LAYOUT,
};
use callstream::llm::Provider;
use callstream::llm::{Generation, Message};
use callstream_actors::asr::file::{transcribe_channels, FileSegment};
use callstream_actors::asr::pool::AsrPool;
use callstream_actors::audio::decode::{decode, OUTPUT_RATE};
use callstream_actors::transcript::{dialogue, speaker_label};
use serde_json::Value;

use super::labelled::{names_it, read_calls, supports_claim, Call, Label, Placed};

/// Options of `bench analysis`.
pub struct Options {
    /// The labelled set.
    pub set: PathBuf,
    /// Use the written dialogues instead of transcribing the recordings.
    pub text: bool,
    /// Where the recordings' transcripts are kept between runs, if anywhere.
    pub transcripts: Option<PathBuf>,
    /// Run only the first N calls.
    pub limit: Option<usize>,
    /// Only the calls whose id starts with one of these (all when empty).
    pub calls: Vec<String>,
    /// Only the intent analysis.
    pub intent_only: bool,
    /// How the set's analyses are prompted.
    pub layout: Layout,
    /// Skip the quality part.
    pub no_quality: bool,
    /// The long call for the speed part; `None` skips it.
    pub long_call: Option<PathBuf>,
    /// Times the long call is played back to back.
    pub repeat: usize,
    /// Seconds of the live call at which the intent is asked.
    pub live_at: Vec<u64>,
}

/// How `bench analysis` prompts the labelled set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SetLayout {
    /// As the service prompts a file's analyses: every profile's instructions and examples,
    /// the transcript, then the task.
    Files,
    /// As the service prompts a live call's intent: the profile's own instructions and
    /// examples, then the transcript.
    Live,
}

impl From<SetLayout> for Layout {
    fn from(layout: SetLayout) -> Self {
        match layout {
            SetLayout::Files => FILE_LAYOUT,
            SetLayout::Live => LIVE_LAYOUT,
        }
    }
}

/// The transcript of a recording as the file path builds it: utterances in time order, one
/// line each, labelled with the channel's role.
fn transcribe(
    config: &Config,
    pool: &AsrPool,
    channels: &[Vec<f32>],
) -> anyhow::Result<Vec<FileSegment>> {
    let mut segments = transcribe_channels(
        pool,
        channels,
        "en",
        config.vad.config(),
        config.transcribe.packing(),
        &mut |_, _| {},
    )?;
    segments.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(segments)
}

fn as_dialogue(config: &Config, segments: &[FileSegment]) -> String {
    let roles = &config.transcribe.channel_roles;
    let labels: Vec<String> = segments
        .iter()
        .map(|s| {
            speaker_label(
                roles
                    .get(s.channel)
                    .map_or("speaker", std::string::String::as_str),
            )
        })
        .collect();
    dialogue(
        segments
            .iter()
            .zip(&labels)
            .map(|(s, l)| (l.as_str(), s.text.as_str())),
    )
}

/// A recording's channels at the engine's rate, played `repeat` times back to back.
pub fn load_audio(path: &Path, repeat: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    let decoded = decode(std::fs::read(path)?, ext.as_deref(), OUTPUT_RATE)
        .with_context(|| path.display().to_string())?;
    Ok(decoded
        .channels
        .iter()
        .map(|c| c.repeat(repeat.max(1)))
        .collect())
}

/// Seconds before an ask up to which the kept-warm live call's lines were prepared: lines
/// that became final just before the ask are read with it.
const LAG_S: f64 = 5.0;

struct Timed {
    analysis: Analysis,
    secs: f64,
}

async fn run(
    provider: &dyn Provider,
    kind: ProfileKind,
    layout: Layout,
    transcript: &str,
    seller: Option<&str>,
) -> anyhow::Result<Timed> {
    let started = Instant::now();
    let analysis = analyse_checked(provider, kind, layout, transcript, seller).await?;
    Ok(Timed {
        analysis,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// Counts of a field-status comparison.
#[derive(Default)]
struct Tally {
    right: usize,
    total: usize,
    quotes_given: usize,
    quotes_verbatim: usize,
    quotes_aligned: usize,
    /// Fields labelled identified that came back identified with a quote.
    identified_quoted: usize,
    identified: usize,
    /// Fields labelled identified, with the turns that state them, that came back identified
    /// with a quote from one of those turns; and how many were so labelled.
    identified_own_quote: usize,
    identified_lined: usize,
    /// By field: of the fields labelled identified with the turns that state them that came
    /// back identified, how many have evidence that supports the claim (see
    /// [`supports_claim`]), and how many there were.
    supported: std::collections::BTreeMap<String, (usize, usize)>,
    /// Fields labelled with what their summary must name, and of those, the fields whose
    /// summary names it.
    named: usize,
    named_right: usize,
    /// Fields labelled not_found that came back with a status other than not_found.
    invented: usize,
    absent: usize,
    /// Fields that came back identified or partial, by the model's confidence in tenths:
    /// how many were labelled present (identified or partial) and how many absent.
    reported: std::collections::BTreeMap<u32, (usize, usize)>,
    /// What the check of the evidence by topic did, over every call.
    checked: Checked,
}

impl Tally {
    /// Adds the `analysis` of `call`, whose transcript's sentences are placed in its turns as
    /// `said`, held to the `expected` labels.
    fn add(&mut self, call: &Call, said: &Placed, expected: &[Label], analysis: &Analysis) {
        let id = &call.id;
        self.quotes_given += analysis.quotes.given;
        self.quotes_verbatim += analysis.quotes.verbatim;
        self.quotes_aligned += analysis.quotes.aligned;
        self.checked += analysis.checked;
        for Label {
            field,
            status,
            turns,
            names,
        } in expected
        {
            let record = analysis.record.to_value();
            let got = &record[field];
            let got_status = got["status"].as_str().unwrap_or("?");
            self.total += 1;
            if got_status == status {
                self.right += 1;
            } else {
                println!("    {id} {field}: expected {status}, got {got_status} {got}");
            }
            if status == "identified" {
                self.identified += 1;
                let quoted = got["evidence"].as_array().is_some_and(|e| !e.is_empty());
                if got_status == "identified" && quoted {
                    self.identified_quoted += 1;
                }
                if let Some(names) = names {
                    self.named += 1;
                    let summary = got["summary"].as_str().unwrap_or_default();
                    if names_it(summary, names) {
                        self.named_right += 1;
                    } else {
                        println!(
                            "    {id} {field}: the summary does not name {names}: {summary:?}"
                        );
                    }
                }
                if got_status == "identified" && !turns.is_empty() {
                    let evidence: Vec<String> = got["evidence"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|q| q.as_str().map(str::to_owned))
                        .collect();
                    let summary = got["summary"].as_str().unwrap_or_default();
                    let others: Vec<usize> = expected
                        .iter()
                        .filter(|l| l.field != *field)
                        .flat_map(|l| l.turns.iter().copied())
                        .filter(|t| !turns.contains(t))
                        .collect();
                    let row = self.supported.entry(field.clone()).or_default();
                    row.1 += 1;
                    match supports_claim(summary, &evidence, turns, &others, said) {
                        Ok(()) => row.0 += 1,
                        Err(why) => println!(
                            "    {id} {field}: evidence does not support the claim ({why}): {got}"
                        ),
                    }
                }
                if !turns.is_empty() {
                    self.identified_lined += 1;
                    let from: Vec<Option<usize>> = got["evidence"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(|q| said.turn_of(q))
                        .collect();
                    if got_status == "identified"
                        && from.iter().flatten().any(|t| turns.contains(t))
                    {
                        self.identified_own_quote += 1;
                    } else if got_status == "identified" && quoted {
                        println!(
                            "    {id} {field}: identified, but not quoted from turn {turns:?} (quotes from turns {from:?})"
                        );
                    }
                }
            }
            if status == "not_found" {
                self.absent += 1;
                if got_status != "not_found" {
                    self.invented += 1;
                }
            }
            if matches!(got_status, "identified" | "partial") {
                let tenths = (got["confidence"].as_f64().unwrap_or(0.0) * 10.0).round() as u32;
                let bucket = self.reported.entry(tenths).or_default();
                if status == "not_found" {
                    bucket.1 += 1;
                } else {
                    bucket.0 += 1;
                }
            }
        }
    }

    /// The calibration line: for each confidence the model gave a reported field, how many
    /// such fields were there and how many were absent ("0.8: 7/2").
    fn calibration(&self) -> String {
        self.reported
            .iter()
            .rev()
            .map(|(tenths, (present, absent))| {
                format!(
                    "{:.1}: {}/{absent}",
                    *tenths as f64 / 10.0,
                    present + absent
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn pct(a: usize, b: usize) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        100.0 * a as f64 / b as f64
    }
}

/// Has the model evaluate the prompt of `messages`, as it does for a warm-up, and answer
/// nothing.
pub(crate) async fn evaluate(
    provider: &dyn Provider,
    messages: Vec<Message>,
) -> anyhow::Result<()> {
    let generation =
        Generation::prompt_only(messages, None, callstream::llm::fair::Class::default());
    provider.generate(generation, None).await?;
    Ok(())
}

/// Evaluates each of the prompts the service readies at start ([`warm_ups`]), as requests, so
/// that what a bench times is the service in its steady state, not its first minutes.
pub(crate) async fn ready(provider: &dyn Provider) -> anyhow::Result<()> {
    for messages in warm_ups(Confidence::of(provider)) {
        evaluate(provider, messages).await?;
    }
    Ok(())
}

/// Runs the bench.
pub fn bench(config: &Config, options: &Options) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let provider = callstream::llm::build_provider(config)?;
    let pool = callstream::speech::start_pool(config, None)?;
    println!(
        "model {}; speech {}",
        provider.name(),
        config.models.whisper.display()
    );
    // The service has the embedded model evaluate these prompts when it starts; a bench that
    // asks at once would otherwise find them evaluated in part (a warm-up yields to a
    // request) and time that.
    if matches!(config.llm.provider, LlmProviderKind::Embedded) {
        println!(
            "llama.cpp CPU backend: {}",
            callstream::llm::embedded::cpu_backend()?
        );
        runtime.block_on(ready(provider.as_ref()))?;
    }
    if !options.no_quality {
        quality(config, &runtime, provider.as_ref(), &pool, options)?;
    }
    if let Some(long) = &options.long_call {
        speed(config, &runtime, provider.as_ref(), &pool, long, options)?;
    }
    Ok(())
}

fn quality(
    config: &Config,
    runtime: &tokio::runtime::Runtime,
    provider: &dyn Provider,
    pool: &AsrPool,
    options: &Options,
) -> anyhow::Result<()> {
    let mut calls: Vec<(usize, Call)> = read_calls(&options.set.join("calls.txt"))?
        .into_iter()
        .enumerate()
        .filter(|(_, call)| {
            options.calls.is_empty() || options.calls.iter().any(|p| call.id.starts_with(p))
        })
        .collect();
    calls.truncate(options.limit.unwrap_or(usize::MAX));
    println!(
        "{} labelled calls from {} ({}, prompted as {})",
        calls.len(),
        options.set.display(),
        if options.text {
            "written dialogues"
        } else {
            "transcribed recordings"
        },
        match options.layout {
            Layout::Shared => "every profile's instructions, the transcript, then the task",
            Layout::InstructionsFirst => "the profile's instructions, then the transcript",
        }
    );
    // As the service analyses a file (the written dialogues use the default roles' labels).
    let seller = seller_label(&config.transcribe.channel_roles);
    let (mut intent_right, mut intent_top3) = (0, 0);
    // Main intents by the confidence reported: (level, given, right).
    let mut intent_levels = [("high", 0, 0), ("medium", 0, 0), ("low", 0, 0)];
    let (mut bant, mut neat_p) = (Tally::default(), Tally::default());
    let mut times: Vec<(ProfileKind, f64)> = Vec::new();
    let mut asr_secs = 0.0;
    let (mut transcribed, mut transcripts_read) = (0, 0);
    if let Some(dir) = &options.transcripts {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    for (n, call) in &calls {
        let transcript = if options.text {
            call.written_dialogue()
        } else {
            let (keep_at, kept) = match &options.transcripts {
                Some(dir) => {
                    let (path, text) = kept_transcript(dir, &call.id)?;
                    (Some(path), text)
                }
                None => (None, None),
            };
            match kept {
                Some(text) => {
                    transcripts_read += 1;
                    text
                }
                None => {
                    let audio = options.set.join(format!("call-{:02}.flac", n + 1));
                    let started = Instant::now();
                    let segments = transcribe(config, pool, &load_audio(&audio, 1)?)?;
                    asr_secs += started.elapsed().as_secs_f64();
                    transcribed += 1;
                    let text = as_dialogue(config, &segments);
                    if let Some(path) = &keep_at {
                        std::fs::write(path, &text)
                            .with_context(|| format!("keeping {}", path.display()))?;
                    }
                    text
                }
            }
        };
        tracing::debug!(call = %call.id, %transcript, "the dialogue the analyses read");
        let intent = runtime.block_on(run(
            provider,
            ProfileKind::Intent,
            options.layout,
            &transcript,
            None,
        ))?;
        times.push((ProfileKind::Intent, intent.secs));
        let record = intent.analysis.record.to_value();
        let labels: Vec<&str> = record["intents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["intent"].as_str())
            .collect();
        let top = labels.first().copied().unwrap_or("-");
        let level = record["intents"][0]["confidence"].as_str();
        if let Some(row) = intent_levels.iter_mut().find(|(l, ..)| Some(*l) == level) {
            row.1 += 1;
            row.2 += usize::from(top == call.intent);
        }
        if top == call.intent {
            intent_right += 1;
        } else {
            println!(
                "  miss {}: expected {}, got {:?} ({})",
                call.id,
                call.intent,
                labels,
                record["reasoning"].as_str().unwrap_or_default()
            );
        }
        if labels.contains(&call.intent.as_str()) {
            intent_top3 += 1;
        }
        // As the service does after intent: the two sales records side by side.
        let sales = |labels: &[Label], kind| {
            let wanted = !labels.is_empty() && !options.intent_only;
            let (transcript, seller) = (&transcript, seller.as_deref());
            async move {
                match wanted {
                    true => run(provider, kind, options.layout, transcript, seller)
                        .await
                        .map(Some),
                    false => Ok(None),
                }
            }
        };
        let (b, p) = runtime.block_on(async {
            tokio::try_join!(
                sales(&call.bant, ProfileKind::Bant),
                sales(&call.neat_p, ProfileKind::NeatP)
            )
        })?;
        let said = Placed::new(&transcript, &call.turns);
        if let Some(b) = b {
            times.push((ProfileKind::Bant, b.secs));
            bant.add(call, &said, &call.bant, &b.analysis);
        }
        if let Some(p) = p {
            times.push((ProfileKind::NeatP, p.secs));
            neat_p.add(call, &said, &call.neat_p, &p.analysis);
        }
    }
    let mean = |kind: ProfileKind| {
        let t: Vec<f64> = times
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, s)| *s)
            .collect();
        // "-" for an analysis not run (an empty sum is -0.0).
        if t.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1}", t.iter().sum::<f64>() / t.len() as f64)
        }
    };
    println!(
        "intent top-1          {intent_right}/{} ({:.1}%)",
        calls.len(),
        pct(intent_right, calls.len())
    );
    println!(
        "intent in top 3       {intent_top3}/{} ({:.1}%)",
        calls.len(),
        pct(intent_top3, calls.len())
    );
    println!(
        "intent by confidence, all/right: {}",
        intent_levels
            .iter()
            .map(|(level, given, right)| format!("{level}: {given}/{right}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (name, t) in [("BANT", &bant), ("NEAT-P", &neat_p)] {
        println!(
            "{name:<6} status        {}/{} ({:.1}%); identified with a quote {}/{}, quoted from the turn that states it {}/{}; invented where absent {}/{}",
            t.right,
            t.total,
            pct(t.right, t.total),
            t.identified_quoted,
            t.identified,
            t.identified_own_quote,
            t.identified_lined,
            t.invented,
            t.absent
        );
    }
    for (name, t) in [("BANT", &bant), ("NEAT-P", &neat_p)] {
        let (all, right) = t
            .supported
            .values()
            .fold((0, 0), |(a, r), (right, all)| (a + all, r + right));
        println!(
            "{name:<6} evidence supports claim {right}/{all} ({:.1}%): {}; summary names the settled figure {}/{}",
            pct(right, all),
            t.supported
                .iter()
                .map(|(field, (right, all))| format!("{field} {right}/{all}"))
                .collect::<Vec<_>>()
                .join(", "),
            t.named_right,
            t.named
        );
    }
    for (name, t) in [("BANT", &bant), ("NEAT-P", &neat_p)] {
        let c = t.checked;
        println!(
            "{name:<6} evidence check quotes sorted {}, dropped as off topic {}; fields given a sentence closer to their summary {}, weak quotes replaced by one {}, left not_found {}; fields in doubt (reported only because not_found was held back, or summarised in a worked example's words) {}, kept {}; a clause likelier on topic than its sentence {}; needs given the buyer's sentence about a problem {}; summaries restated from the kept quote (of another sentence, or claiming figures it does not name) {}; quotes another field fits better dropped {}",
            c.sorted, c.dropped, c.repaired, c.replaced, c.cleared, c.doubted, c.doubted_kept, c.by_clause, c.needs_found, c.resummarised, c.unshared
        );
        println!(
            "{name:<6} figures check  quotes about other figures than the summary's {}; fields given the sentence that names them {}, whose figures the buyer never said {}, fields of an amount given the buyer's sentence naming another one on the topic {}; dropped quotes moved to the field they are about {}; summaries' corrected figures restated {}; timelines a date made identified {}, budgets without an amount made partial {}, partial ones naming their amount identified {}",
            c.other_figures, c.figures_found, c.figures_unsaid, c.amounts_found, c.moved, c.restated, c.dated, c.amountless, c.amounted
        );
    }
    for (name, t) in [("BANT", &bant), ("NEAT-P", &neat_p)] {
        println!(
            "{name:<6} fields reported (identified or partial) by confidence, all/absent: {}",
            t.calibration()
        );
    }
    let (given, verbatim, aligned) = (
        bant.quotes_given + neat_p.quotes_given,
        bant.quotes_verbatim + neat_p.quotes_verbatim,
        bant.quotes_aligned + neat_p.quotes_aligned,
    );
    println!(
        "evidence verbatim     {verbatim}/{given} ({:.1}%); near quotes aligned to what was said {aligned}",
        pct(verbatim, given)
    );
    println!(
        "mean seconds          intent {}, BANT {}, NEAT-P {}; transcription {:.1} per call",
        mean(ProfileKind::Intent),
        mean(ProfileKind::Bant),
        mean(ProfileKind::NeatP),
        asr_secs / transcribed.max(1) as f64
    );
    if let Some(dir) = &options.transcripts {
        println!(
            "transcripts           {transcripts_read} read from {dir}, {transcribed} transcribed and kept there",
            dir = dir.display()
        );
    }
    Ok(())
}

/// Where call `id`'s transcript is kept in `dir`, and the transcript, if it is there.
pub(crate) fn kept_transcript(dir: &Path, id: &str) -> anyhow::Result<(PathBuf, Option<String>)> {
    anyhow::ensure!(
        !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !id.starts_with('.'),
        "call id {id:?} cannot name a file"
    );
    let path = dir.join(format!("{id}.txt"));
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok((path, Some(text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((path, None)),
        Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", path.display()))),
    }
}

fn speed(
    config: &Config,
    runtime: &tokio::runtime::Runtime,
    provider: &dyn Provider,
    pool: &AsrPool,
    long: &Path,
    options: &Options,
) -> anyhow::Result<()> {
    let seller = seller_label(&config.transcribe.channel_roles);
    let channels = load_audio(long, options.repeat)?;
    let minutes = channels
        .first()
        .map_or(0.0, |c| c.len() as f64 / OUTPUT_RATE as f64 / 60.0);
    let started = Instant::now();
    let segments = transcribe(config, pool, &channels)?;
    let transcript = as_dialogue(config, &segments);
    println!(
        "long call: {minutes:.1} min, {} utterances, {} words; transcribed in {:.1} s",
        segments.len(),
        transcript.split_whitespace().count(),
        started.elapsed().as_secs_f64()
    );
    // Another transcript, analysed between the live call's analyses, so that each of them
    // starts from a model whose context holds something else.
    let other = "Customer: Hi, I'd like to know what time your branch opens on Saturday.\n\
                 Agent: It opens at nine.\n";
    runtime.block_on(async {
        let _ = run(provider, ProfileKind::Intent, FILE_LAYOUT, other, None).await?;
        // As the service analyses a file: intent, then the two sales records side by side.
        let started = Instant::now();
        let analyse = |kind| run(provider, kind, FILE_LAYOUT, &transcript, seller.as_deref());
        let intent = analyse(ProfileKind::Intent).await?;
        let (bant, neat_p) =
            tokio::try_join!(analyse(ProfileKind::Bant), analyse(ProfileKind::NeatP))?;
        for (kind, t) in [
            (ProfileKind::Intent, intent),
            (ProfileKind::Bant, bant),
            (ProfileKind::NeatP, neat_p),
        ] {
            println!(
                "  {kind:?}: {:.1} s ({} prompt tokens, {} generated)",
                t.secs, t.analysis.usage.prompt_tokens, t.analysis.usage.completion_tokens
            );
        }
        println!(
            "three analyses of the long call (BANT and NEAT-P side by side): {:.1} s",
            started.elapsed().as_secs_f64()
        );
        println!(
            "live call, intent asked as the transcript grows (another call analysed in between):"
        );
        println!("  asked every minute: the call's evaluated prompt is kept from the last ask");
        println!(
            "  kept warm: each final line was handed over to prepare (as after a first analyze), \
             up to {LAG_S} s before the ask"
        );
        println!("  at s   utterances  words  asked every minute  kept warm");
        // The second pass is another call (it opens with a greeting the first has not), so
        // nothing of the first pass is reused.
        let greeting = "Agent: Thank you for calling, you are speaking with Sam.\n";
        let upto = |opening: &str, secs: f64| {
            let so_far: Vec<FileSegment> =
                segments.iter().filter(|s| s.end <= secs).cloned().collect();
            (
                so_far.len(),
                format!("{opening}{}", as_dialogue(config, &so_far)),
            )
        };
        for &at in &options.live_at {
            let (utterances, text) = upto("", at as f64);
            let every_minute = run(provider, ProfileKind::Intent, LIVE_LAYOUT, &text, None)
                .await?
                .secs;
            run(provider, ProfileKind::Intent, LIVE_LAYOUT, other, None).await?;
            // What the intent actor hands over as lines arrive, evaluated as the model does
            // for a warm-up: the prompt only.
            let (_, before) = upto(greeting, at as f64 - LAG_S);
            evaluate(
                provider,
                messages(
                    ProfileKind::Intent,
                    LIVE_LAYOUT,
                    Confidence::of(provider),
                    &before,
                ),
            )
            .await?;
            run(provider, ProfileKind::Intent, LIVE_LAYOUT, other, None).await?;
            let (_, now) = upto(greeting, at as f64);
            let warm = run(provider, ProfileKind::Intent, LIVE_LAYOUT, &now, None)
                .await?
                .secs;
            println!(
                "  {at:>4}  {utterances:>10}  {:>5}  {every_minute:>16.2} s  {warm:>7.2} s",
                text.split_whitespace().count(),
            );
        }
        Ok::<_, anyhow::Error>(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_labelled_set_is_complete_and_consistent() {
        let dir =
            callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("fixtures/analysis");
        let calls = read_calls(&dir.join("calls.txt")).unwrap();
        let labels = callstream::llm::profiles::intent_labels();
        // At least 40 calls over the 14 intents, plus 18 sales calls, 6 of them with the
        // authority and the budget stated side by side (in one turn or the next), and some in
        // which the customer corrects the figure they settle on.
        let sales: Vec<&Call> = calls.iter().filter(|c| !c.bant.is_empty()).collect();
        assert_eq!(sales.len(), 18);
        let turns_of = |call: &Call, field: &str| -> Vec<usize> {
            call.bant
                .iter()
                .find(|l| l.field == field)
                .map(|l| l.turns.clone())
                .unwrap_or_default()
        };
        let adjacent = sales
            .iter()
            .filter(|c| {
                let (a, b) = (turns_of(c, "authority"), turns_of(c, "budget"));
                a.iter().any(|x| b.iter().any(|y| x.abs_diff(*y) <= 1))
            })
            .count();
        assert!(adjacent >= 6, "{adjacent}");
        let named = sales
            .iter()
            .flat_map(|c| c.bant.iter().chain(&c.neat_p))
            .filter(|l| l.names.is_some())
            .count();
        assert!(named >= 3, "{named}");
        assert!(calls.len() - sales.len() >= 40);
        for label in labels {
            assert!(
                calls.iter().any(|c| &c.intent == label),
                "no call for {label}"
            );
        }
        let statuses = ["identified", "partial", "not_found"];
        for call in &calls {
            assert!(
                labels.contains(&call.intent),
                "{}: {}",
                call.id,
                call.intent
            );
            assert!(
                call.turns.iter().any(|(customer, _)| *customer),
                "{}",
                call.id
            );
            for (fields, expected) in [
                (&call.bant, vec!["budget", "authority", "need", "timeline"]),
                (
                    &call.neat_p,
                    vec![
                        "need",
                        "economic_impact",
                        "access_to_authority",
                        "timeline",
                        "priority",
                    ],
                ),
            ] {
                if fields.is_empty() {
                    continue;
                }
                let names: Vec<&str> = fields.iter().map(|l| l.field.as_str()).collect();
                assert_eq!(names, expected, "{}", call.id);
                for label in fields.iter() {
                    assert!(statuses.contains(&label.status.as_str()));
                    // A stated field names the customer's turns that state it; no other does.
                    assert_eq!(
                        label.status == "identified",
                        !label.turns.is_empty(),
                        "{} {}",
                        call.id,
                        label.field
                    );
                    assert!(
                        label.names.is_none() || label.status == "identified",
                        "{} {}: only a stated field names a figure",
                        call.id,
                        label.field
                    );
                    for &line in &label.turns {
                        assert!(
                            call.turns
                                .get(line.wrapping_sub(1))
                                .is_some_and(|(c, _)| *c),
                            "{} {}: turn {line} is not the customer's",
                            call.id,
                            label.field
                        );
                    }
                }
            }
        }
        // Every status occurs among the sales calls' labels.
        for status in statuses {
            assert!(sales.iter().any(|c| c
                .bant
                .iter()
                .chain(&c.neat_p)
                .any(|l| l.status == status)));
        }
        // Each call has its recording in both renderings (espeak-ng; the neural voice in
        // natural/, which reads the same calls.txt): two channels, the customer on the first.
        let natural = dir.join("natural");
        assert_eq!(read_calls(&natural.join("calls.txt")).unwrap(), calls);
        for set in [&dir, &natural] {
            for (n, call) in calls.iter().enumerate() {
                let audio = load_audio(&set.join(format!("call-{:02}.flac", n + 1)), 1).unwrap();
                assert_eq!(audio.len(), 2, "{}", call.id);
                let energy = |c: &[f32]| c.iter().map(|v| v * v).sum::<f32>();
                assert!(
                    energy(&audio[0]) > 0.0 && energy(&audio[1]) > 0.0,
                    "{}",
                    call.id
                );
            }
            assert!(!set
                .join(format!("call-{:02}.flac", calls.len() + 1))
                .exists());
        }
    }

    #[test]
    fn a_kept_transcript_is_read_back_and_an_id_must_name_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, text) = kept_transcript(dir.path(), "sales-1").unwrap();
        assert_eq!(path, dir.path().join("sales-1.txt"));
        assert_eq!(text, None);
        std::fs::write(&path, "Customer: Hello.\n").unwrap();
        let (_, text) = kept_transcript(dir.path(), "sales-1").unwrap();
        assert_eq!(text.as_deref(), Some("Customer: Hello.\n"));
        for id in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(kept_transcript(dir.path(), id).is_err(), "{id:?}");
        }
    }

    /// The words that carry a call's content: the WER's normal form without the speaker
    /// labels and the small words every call shares.
    fn content_words(text: &str) -> Vec<String> {
        const SMALL: &[&str] = &[
            "a", "about", "agent", "all", "also", "an", "and", "any", "are", "as", "at", "be",
            "but", "by", "can", "could", "customer", "did", "do", "does", "for", "from", "good",
            "had", "has", "have", "hello", "hi", "how", "i", "i'd", "i'll", "i'm", "i've", "if",
            "in", "is", "it", "it's", "just", "let", "me", "morning", "my", "no", "not", "of",
            "oh", "on", "or", "our", "please", "so", "thank", "thanks", "that", "the", "then",
            "there", "this", "to", "up", "us", "was", "we", "what", "when", "which", "will",
            "with", "would", "yes", "you", "your",
        ];
        callstream_actors::asr::wer::normalise(text)
            .into_iter()
            .filter(|w| !SMALL.contains(&w.as_str()))
            .collect()
    }

    #[test]
    fn no_worked_example_retells_a_labelled_call() {
        // The set measures calls the prompts have never seen: a worked example that retells
        // one of them (the same situation in nearly the same words) would score the bench on
        // the example rather than on the model. Checked on content words in order.
        const MAX_SHARED: f64 = 0.3;
        let dir =
            callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR")).join("fixtures/analysis");
        let calls: Vec<(String, Vec<String>)> = read_calls(&dir.join("calls.txt"))
            .unwrap()
            .into_iter()
            .map(|c| {
                let said: Vec<&str> = c.turns.iter().map(|(_, t)| t.as_str()).collect();
                (c.id, content_words(&said.join(" ")))
            })
            .collect();
        let retells = |example: &str| -> Option<(String, f64)> {
            let words = content_words(example);
            calls
                .iter()
                .map(|(id, call)| {
                    let shared = callstream_actors::asr::wer::words_in_order(&words, call);
                    (id.clone(), shared as f64 / words.len().max(1) as f64)
                })
                .find(|(_, share)| *share > MAX_SHARED)
        };
        for kind in callstream::llm::profiles::ProfileKind::ALL {
            for (i, example) in callstream::llm::profiles::profile(kind)
                .examples
                .iter()
                .enumerate()
            {
                assert_eq!(retells(&example.transcript), None, "{kind:?} example {i}");
            }
        }
        // The check finds a retelling: a labelled call in other words but the same content.
        let retold = "Customer: I got married recently and must change my surname on the \
                      account.\nAgent: Congratulations.\nCustomer: Please update my email \
                      address too, the old one will close.";
        assert_eq!(retells(retold).map(|(id, _)| id), Some("account-1".into()));
    }
}
