"""The pod's voice host: one process that runs every voice of a pod.

A pool pod runs Triton with one stream model per voice, as before, but the stream models are
thin: each one decodes its requests and hands them to the voice host over a Unix socket, and
sends the audio that comes back as its decoupled responses. The voice host holds the stage
runtimes, one per architecture (on a GPU: one CUDA context, one set of captured graphs), the
voices as weight sets in them, one scheduler per architecture that steps the streams of all
its voices, and one phonemiser pool.

- `protocol`: the frames on the socket.
- `host`: `VoiceHost`, the voices, their architectures and the pod's memory (no I/O).
- `server`: the socket server (`python -m engines.pod.voice_host`).
- `client`: `HostClient`, what a stream model and the supervisor talk to it with.
- `process`: `VoiceHostProcess`, starting and stopping one.
"""
