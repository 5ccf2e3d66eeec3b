"""The speech API: OpenAI-compatible `POST /v1/audio/speech` and a WebSocket for text that
arrives as an LLM writes it, in front of the voices' Triton endpoints (`voxfleet api`).

Modules, each with one job: `request` (what a request may say, validated), `voices` (the
voice table: OpenAI's names → TTSVoices), `directory` (which endpoints serve a voice now),
`upstream` (one gRPC stream from one Triton endpoint), `synthesis` (a voice's stream through
`engines.client.balancing`, resampled to the asked rate), `audio` (resampling and encoding),
`sentences` (sentence ends in raw LLM tokens), `session` (the WebSocket's protocol), `sse`,
`errors` (OpenAI's error envelope: the only place gRPC statuses become HTTP codes), `auth`
and `app` (the ASGI application).
"""
