# hookrelay container image: built with the Rust toolchain, run on a minimal base as
# a non-root user. Build: docker build -t hookrelay .
# Run:   docker run -p 8080:8080 -p 8079:8079 -v hookrelay-data:/var/lib/hookrelay hookrelay

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
# vendor/: actix-http with the ingress's widened HTTP limits ([patch.crates-io]).
COPY Cargo.toml Cargo.lock ./
COPY vendor ./vendor
RUN mkdir src benches \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && for b in ingest delivery footprint fleet console shape audit capacity runaway latency checkpoint_pages; do echo 'fn main() {}' > "benches/$b.rs"; done \
    && cargo build --release --locked \
    && rm -rf src benches
COPY src ./src
COPY benches ./benches
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin hookrelay \
    && mkdir -p /out/data

# distroless/cc: glibc, libgcc, CA certificates (outbound TLS), a nonroot user; no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/hookrelay /usr/local/bin/hookrelay
COPY config/hookrelay.toml /etc/hookrelay/hookrelay.toml
# The data directory exists, owned by the runtime user, so that a new volume is too.
COPY --from=build --chown=65532:65532 /out/data /var/lib/hookrelay
# Inside a container both listeners bind every interface (publish only 8080); the data
# goes to the volume. The relay refuses to start so with the example tokens of the
# default config: mount a config with your own tokens over it.
ENV HOOKRELAY__INGRESS__LISTEN=0.0.0.0:8080 \
    HOOKRELAY__ADMIN__LISTEN=0.0.0.0:8079 \
    HOOKRELAY__STORAGE__DATA_DIR=/var/lib/hookrelay \
    HOOKRELAY__LOG__FORMAT=json
USER 65532:65532
EXPOSE 8080 8079
VOLUME ["/var/lib/hookrelay"]
ENTRYPOINT ["/usr/local/bin/hookrelay"]
CMD ["serve", "--config", "/etc/hookrelay/hookrelay.toml"]
