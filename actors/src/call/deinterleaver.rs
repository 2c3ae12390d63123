//! The deinterleaver: turns each binary frame of the call (PCMU or L16, channels interleaved
//! sample by sample) into one block of 16-bit samples per channel and hands each block to that
//! channel's transcriber. A language change and the end of the call go the same way, so they
//! reach each transcriber in order with the frames.

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::settings::Credit;
use super::transcriber::TranscriberMsg;
use crate::audio::frame::{deinterleave_into, Encoding};

/// Messages of the [`Deinterleaver`].
#[derive(Debug)]
pub enum DeinterleaverMsg {
    /// One binary frame, already checked to hold whole sample frames.
    Frame(Vec<u8>, Credit),
    /// Later audio is in this model language: tell every transcriber, after the frames before
    /// this.
    Language(String),
    /// The call is closing: tell every transcriber, after the frames before this.
    Finish,
}

/// Arguments of the [`Deinterleaver`].
#[derive(Debug)]
pub struct DeinterleaverArgs {
    /// The negotiated encoding.
    pub encoding: Encoding,
    /// One transcriber per channel, in the negotiated channel order.
    pub transcribers: Vec<ActorRef<TranscriberMsg>>,
}

/// The deinterleaver actor.
#[derive(Debug, Default)]
pub struct Deinterleaver;

impl Actor for Deinterleaver {
    type Msg = DeinterleaverMsg;
    type State = DeinterleaverArgs;
    type Arguments = DeinterleaverArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: DeinterleaverArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (bytes, credit) = match message {
            DeinterleaverMsg::Frame(bytes, credit) => (bytes, credit),
            DeinterleaverMsg::Language(language) => {
                for transcriber in &state.transcribers {
                    transcriber.cast(TranscriberMsg::Language(language.clone()))?;
                }
                return Ok(());
            }
            DeinterleaverMsg::Finish => {
                for transcriber in &state.transcribers {
                    transcriber.cast(TranscriberMsg::Finish)?;
                }
                return Ok(());
            }
        };
        let channels = state.transcribers.len();
        let per_channel = bytes.len() / (channels * state.encoding.bytes_per_sample());
        // Fresh buffers: each block moves on to its transcriber.
        let mut blocks: Vec<Vec<i16>> = vec![vec![0; per_channel]; channels];
        {
            let mut outs: Vec<&mut [i16]> = blocks.iter_mut().map(Vec::as_mut_slice).collect();
            deinterleave_into(state.encoding, &bytes, &mut outs)?;
        }
        for (transcriber, block) in state.transcribers.iter().zip(blocks) {
            transcriber.cast(TranscriberMsg::Samples(block, credit.clone()))?;
        }
        Ok(())
    }
}
