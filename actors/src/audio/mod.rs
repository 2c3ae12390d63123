//! The audio path, sans-IO: plain functions and state machines over slices. Nothing here does
//! I/O, spawns, or allocates per frame; callers own the buffers (sizing helpers are provided)
//! and allocating conveniences sit beside the `*_into` functions.
//!
//! Live call: [`frame`] (PCMU/L16 bytes -> per-channel i16) -> [`vad`] (8 kHz utterances) ->
//! [`resample`] (8 -> 16 kHz f32) -> [`mel`] (Whisper features) -> speech engine.
//! Files: [`decode`] (any supported file -> 16 kHz f32 per channel).

pub mod decode;
pub mod frame;
pub mod g711;
pub mod mel;
pub mod resample;
pub mod vad;
