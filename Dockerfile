# Multi-stage build of the binaries into one small static image.
#   docker build -t stepcollect \
#     --build-arg COMMIT=$(git rev-parse --short=12 HEAD) .
#   docker run stepcollect /api -version      (or /worker, /migrate, /nanocmd, /nanohub; -h for the flags)
# Both base images are pinned: the builder to an exact Go release, the
# runtime by digest (distroless publishes no versioned tags).
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# What -version prints and stepcollect_build_info says (internal/version).
# The version is internal/version.Release unless VERSION names another (a
# packager's own); the build context has no .git (.dockerignore), so the
# commit comes in as an argument; the build time is taken here.
ARG VERSION=
ARG COMMIT=unknown
ARG BUILD_DATE=
RUN set -e; \
    pkg=github.com/stepcollect/stepcollect/internal/version; \
    date="${BUILD_DATE:-$(date -u +%Y-%m-%dT%H:%M:%SZ)}"; \
    ldflags="-s -w -X $pkg.version=${VERSION} -X $pkg.commit=${COMMIT:-unknown} -X $pkg.date=$date"; \
    for main in cmd/api cmd/worker cmd/migrate cmd/nanocmd cmd/nanohub; do \
      CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags="$ldflags" -o /out/ ./$main; \
    done

# distroless/static: CA certificates (rediss://, https callbacks), tzdata, a
# non-root user, and nothing else: no shell, so health checks run
# `/api -probe` and `/worker -probe`.
FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
COPY --from=build /out/api /out/worker /out/migrate /out/nanocmd /out/nanohub /
USER nonroot:nonroot
EXPOSE 9100 9101
ENTRYPOINT []
CMD ["/api"]
