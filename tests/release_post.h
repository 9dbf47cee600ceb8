/*
 * A signed release directory (what `hotkern sign`/`publish` writes) pushed
 * to a running endpoint as the binary frame `hotkern push` sends, for the
 * suites that publish with the CLI and apply through the endpoint.
 */
#ifndef HK_TESTS_RELEASE_POST_H
#define HK_TESTS_RELEASE_POST_H

/* Reads DIR/manifest.json, its .sig and every artifact it names
 * (DIR/artifacts/<sha256>), frames them and POSTs the frame to
 * http://127.0.0.1:PORT/v1/release. Returns the HTTP status (0: no
 * answer, -1: the directory could not be read); *body (may be NULL)
 * receives the answer, malloc'd. */
long hkt_post_release(unsigned port, const char *dir, char **body);

#endif
