// Package relay is inplaced's CRI v1 pass-through: it forwards every call it
// receives to a backend CRI endpoint untouched, and decodes only the methods
// that have an interceptor registered.
//
// Server (router.go) serves the caller's connection at the HTTP/2 frame
// level: a stream no interceptor, open gate, stream filter or debug log wants
// is forwarded frame by frame to a backend HTTP/2 connection; every other one
// goes, the same way, to an in-process grpc.Server running the gRPC handler
// described below (Relay.ServerOptions).
//
// Server.Drain (drain.go) hands the callers over to the next process on the
// same socket at a restart: GOAWAY to each, the calls in flight let finish
// within the grace, the connections made meanwhile held and then sent on.
//
// The gRPC handler:
//
//   - The server is created with grpc.UnknownServiceHandler and a codec that
//     passes frames through untouched (ForceServerCodecV2), so no CRI
//     service is registered: every method, including ones added to CRI after
//     this build, reaches Relay.handle. The proxy never answers Unimplemented
//     on its own — the backend does, if it must.
//   - Methods known to be unary (from the cri-api ServiceDescs) take a fast
//     path: one frame in, conn.Invoke, one frame out. A unary method with no
//     interceptor (and no debug log, which decodes IDs) is not even copied:
//     the request and answer stay in the buffers gRPC read them into until
//     gRPC writes them out again (passFrame, codecV2). Everything else
//     (GetContainerEvents, Stream* and unknown methods) is pumped as a
//     bidirectional stream, which is correct for every gRPC streaming shape.
//   - Metadata, deadlines and cancellation travel with the context; headers
//     and trailers are copied back; backend status errors are returned as
//     they are, so codes and messages reach the caller unchanged.
//   - An Interceptor registered for a method sees the raw request and a
//     `next` that forwards it. Unary adapts a typed function
//     (e.g. *runtimeapi.CreateContainerRequest) to that shape, so only
//     intercepted methods pay for decoding.
//
// # Threat model
//
// Who reaches the relay: whoever can connect to inplaced's CRI socket
// (root, or the socket's group: kubelet, crictl, node agents). Such a caller
// can already make containerd run anything, so the relay does not defend
// containerd's contents from it; it defends availability — inplaced's own
// memory and CPU, containerd's, and the other callers' calls (kubelet's
// above all) — against a caller that is buggy or hostile at the HTTP/2
// level. The backends are containerd or CRI-O, trusted, but a backend that
// stalls must not stall what does not depend on it.
//
// What a caller can make inplaced and the backend do, and the bound:
//
//   - Open streams: at most maxStreams at once (SETTINGS_MAX_CONCURRENT_STREAMS,
//     enforced with REFUSED_STREAM); each goes to the backend, within the
//     backend's own MAX_CONCURRENT_STREAMS (streams beyond it wait, as in
//     grpc-go's client, and are never sent over it).
//   - Open and reset streams in a loop (CVE-2023-44487): every reset of a
//     stream the backend had not answered, and every refused stream, counts;
//     every answered call takes one off; past rapidResetLimit the connection
//     ends (GOAWAY ENHANCE_YOUR_CALM). The backend sees at most that many
//     cancelled calls more than answered ones per connection, and none for
//     a stream whose RST_STREAM came right behind its HEADERS
//     (session.resetNext). An attacker that reconnects at once is bounded
//     per connection only: connections cost it a handshake each.
//   - Before those limits end a connection, its flood is paced: past
//     paceFree wasted resets or control frames, the caller's reader pauses
//     pacePause after every paceEvery more, so that a flood cannot take
//     every CPU from the other callers.
//   - Make us acknowledge: more than maxControlFrames PING or SETTINGS frames
//     between two HEADERS or DATA frames we send it end the connection; so
//     do more than maxQueuedControlFrames acknowledgements waiting for a
//     caller that does not read them.
//   - Header blocks: at most maxHeaderList decoded bytes (x/net's checks)
//     and maxHeaderFrames frames per block (CONTINUATION floods).
//   - Memory: data waits in the router only within the windows it granted
//     (16 MiB a stream, 32 MiB a connection); a request that is not gRPC is
//     answered by the router and reaches no backend.
//   - Stop reading: writes never wait under the session's lock (sockWriter);
//     what a peer does not take waits in its overflow up to maxOverflow,
//     then the session stops reading until it drains or the write deadline
//     (30 s) ends the connection. Other sessions are never affected: each
//     caller connection has its own state, lock and backend connections.
//
// With WithGRPCServer (config relay: grpc) the callers' connections are
// grpc-go's server's own, with its limits; the router's request checks
// still run in front of it (checkedConn, grpccheck.go), so a malformed
// request reaches no backend in either mode.
//
// Each limit that ends a connection is logged (warn) and counted by the
// abuse observer (the metric inplaced_relay_abuse_total{limit}). Protocol
// errors end the connection with the HTTP/2 error code (GOAWAY) or, where
// RFC 9113 makes them stream errors, the stream (RST_STREAM).
package relay
