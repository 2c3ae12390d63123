#!/usr/bin/env python3
"""faster-whisper on a recording, channel after channel, for side-by-side comparison with
`callstream bench files`: same CTranslate2 model directory, int8, one CPU thread, the given beam,
its own VAD on, word timestamps on. Prints one JSON object: CPU and wall seconds of the
transcription (model loading excluded), and each channel's words.

Usage: fw_compare.py MODEL_DIR AUDIO.wav BEAM LANGUAGE
(needs faster-whisper on PYTHONPATH: scripts/setup.sh --bench installs it)
"""
import json
import resource
import sys
import time
import wave

import numpy as np
from faster_whisper import WhisperModel


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    model_dir, audio_path, beam, language = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    with wave.open(audio_path) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2
        channels = w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, channels)
    model = WhisperModel(model_dir, device="cpu", compute_type="int8", cpu_threads=1, num_workers=1)
    cpu0, wall0 = cpu(), time.monotonic()
    out = []
    for c in range(channels):
        audio = pcm[:, c].astype(np.float32) / 32768.0
        segments, _ = model.transcribe(audio, language=language, beam_size=beam, vad_filter=True,
                                       word_timestamps=True)
        words = [w.word.strip() for s in segments for w in (s.words or [])]
        out.append(words)
    print(json.dumps({"cpu_s": cpu() - cpu0, "wall_s": time.monotonic() - wall0, "channels": out}))


if __name__ == "__main__":
    main()
