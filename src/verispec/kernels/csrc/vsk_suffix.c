/* A suffix trie of bounded depth over token sequences, with counts: what followed each context of up to
 * `depth` tokens, and how often (SuffixDecoding's structure, Oliaro et al. 2025). It drafts by lookup: the
 * longest suffix of a request's context found in the trie, then the continuations seen after it, most frequent
 * first, as a chain or as a tree of candidates.
 *
 * A node is a substring s of at most `depth` tokens seen in the sequences added; its count is how many windows
 * (a sequence's tokens from one position on, cut at `depth`) start with s, so a child's count never exceeds its
 * parent's. Children are found through one open-addressing hash map keyed by (parent, token) and listed through
 * a sibling chain. Sequences are added whole (vsk_suffix_add) or token by token (vsk_suffix_extend, which keeps
 * the nodes of the context's last depth - 1 suffixes in a cursor); removing one (weight -1) leaves nodes of count 0,
 * which are skipped, and the caller rebuilds a trie when too many are. Not thread-safe: one trie, one thread. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VSK_API __attribute__((visibility("default")))

/* Node indices are int32 (a node is 24 bytes, not 32): a trie holds at most MAX_NODES nodes, and making one more
 * fails as running out of memory does. */
#define MAX_NODES INT32_MAX
/* A new trie starts this small (under 1 KB) and doubles as it grows: the server keeps one per tenant. */
#define FIRST_NODES 16

typedef struct {
    int32_t token, parent, first_child, next_sibling;
    int64_t count;
} node_t;

typedef struct {
    int depth;
    node_t *nodes;
    int64_t used, capacity;
    int64_t *table; /* (parent, token) -> node index + 1; 0 = empty */
    int64_t slots;  /* a power of two, at least twice the nodes */
    int64_t live;   /* nodes of count > 0 */
} vsk_suffix;

static uint64_t mix(int32_t parent, int32_t token) {
    uint64_t x = ((uint64_t)(uint32_t)parent << 32) | (uint32_t)token;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static int64_t lookup(const vsk_suffix *t, int32_t parent, int32_t token) {
    for (uint64_t i = mix(parent, token) & (uint64_t)(t->slots - 1);; i = (i + 1) & (uint64_t)(t->slots - 1)) {
        const int64_t at = t->table[i];
        if (!at) return -1;
        const node_t *n = &t->nodes[at - 1];
        if (n->parent == parent && n->token == token) return at - 1;
    }
}

static int grow(vsk_suffix *t) {
    if (t->used + 1 > MAX_NODES) return -1; /* nodes link each other by int32 indices */
    if (t->used + 1 > t->capacity) {
        const int64_t capacity = t->capacity * 2;
        node_t *nodes = realloc(t->nodes, sizeof(node_t) * (size_t)capacity);
        if (!nodes) return -1;
        t->nodes = nodes;
        t->capacity = capacity;
    }
    if (2 * (t->used + 1) > t->slots) { /* rehash into twice the slots */
        const int64_t slots = t->slots * 2;
        int64_t *table = calloc((size_t)slots, sizeof(int64_t));
        if (!table) return -1;
        for (int64_t n = 1; n < t->used; n++) { /* node 0 is the root, in no slot */
            uint64_t i = mix(t->nodes[n].parent, t->nodes[n].token) & (uint64_t)(slots - 1);
            while (table[i]) i = (i + 1) & (uint64_t)(slots - 1);
            table[i] = n + 1;
        }
        free(t->table);
        t->table = table;
        t->slots = slots;
    }
    return 0;
}

/* the child of `parent` for `token`, made (count 0) when missing; -1 when out of memory */
static int64_t child(vsk_suffix *t, int32_t parent, int32_t token) {
    const int64_t found = lookup(t, parent, token);
    if (found >= 0 || grow(t)) return found;
    const int64_t n = t->used++;
    t->nodes[n] = (node_t){token, parent, -1, t->nodes[parent].first_child, 0};
    t->nodes[parent].first_child = (int32_t)n;
    uint64_t i = mix(parent, token) & (uint64_t)(t->slots - 1);
    while (t->table[i]) i = (i + 1) & (uint64_t)(t->slots - 1);
    t->table[i] = n + 1;
    return n;
}

static void count(vsk_suffix *t, int64_t n, int weight) {
    const int64_t before = t->nodes[n].count;
    t->nodes[n].count += weight;
    t->live += (before <= 0 && t->nodes[n].count > 0) - (before > 0 && t->nodes[n].count <= 0);
}

VSK_API vsk_suffix *vsk_suffix_new(int depth) {
    vsk_suffix *t = calloc(1, sizeof(vsk_suffix));
    if (!t) return NULL;
    t->depth = depth;
    t->capacity = FIRST_NODES;
    t->slots = 4 * FIRST_NODES;
    t->nodes = malloc(sizeof(node_t) * (size_t)t->capacity);
    t->table = calloc((size_t)t->slots, sizeof(int64_t));
    if (!t->nodes || !t->table) {
        free(t->nodes);
        free(t->table);
        free(t);
        return NULL;
    }
    t->nodes[0] = (node_t){-1, -1, -1, -1, 0};
    t->used = 1;
    return t;
}

VSK_API void vsk_suffix_free(vsk_suffix *t) {
    if (!t) return;
    free(t->nodes);
    free(t->table);
    free(t);
}

/* nodes made, and nodes of count > 0 */
VSK_API int64_t vsk_suffix_nodes(const vsk_suffix *t) { return t->used - 1; }
VSK_API int64_t vsk_suffix_live(const vsk_suffix *t) { return t->live; }

/* every window of tokens[0 .. n) counted `weight` times (+1 to add a sequence, -1 to remove it); 0, or -1 when
 * out of memory */
VSK_API int vsk_suffix_add(vsk_suffix *t, const int32_t *tokens, int n, int weight) {
    for (int start = 0; start < n; start++) {
        int64_t at = 0;
        const int end = start + t->depth < n ? start + t->depth : n;
        for (int i = start; i < end; i++) {
            at = child(t, (int32_t)at, tokens[i]);
            if (at < 0) return -1;
            count(t, at, weight);
        }
    }
    return 0;
}

/* a sequence grown token by token: `cursor` holds the nodes of its last suffixes, of lengths 1 .. depth - 1
 * (cursor[0] = how many); extending by `token` counts each of them followed by it, and the token alone. The cursor
 * has room for `depth` entries. 0, or -1 when out of memory. */
VSK_API int vsk_suffix_extend(vsk_suffix *t, int64_t *cursor, int32_t token) {
    const int64_t held = cursor[0];
    int64_t next[256];
    int64_t kept = 0;
    if (t->depth > 256) return -1;
    const int64_t alone = child(t, 0, token);
    if (alone < 0) return -1;
    count(t, alone, 1);
    if (t->depth > 1) next[kept++] = alone;
    for (int64_t i = 0; i < held; i++) { /* longer suffixes, shortest first */
        const int64_t at = child(t, (int32_t)cursor[1 + i], token);
        if (at < 0) return -1;
        count(t, at, 1);
        if (i + 2 < t->depth) next[kept++] = at;
    }
    cursor[0] = kept;
    memcpy(cursor + 1, next, sizeof(int64_t) * (size_t)kept);
    return 0;
}

/* the longest suffix of context[0 .. n) (at most depth - 1 tokens) that the trie holds with a live continuation:
 * its node, and its length in *length (0 and the root when none) */
VSK_API int64_t vsk_suffix_match(const vsk_suffix *t, const int32_t *context, int n, int *length) {
    const int most = n < t->depth - 1 ? n : t->depth - 1;
    for (int len = most; len > 0; len--) {
        int64_t at = 0;
        for (int i = n - len; i < n && at >= 0; i++) {
            at = lookup(t, (int32_t)at, context[i]);
            if (at >= 0 && t->nodes[at].count <= 0) at = -1;
        }
        if (at < 0) continue;
        for (int32_t c = t->nodes[at].first_child; c >= 0; c = t->nodes[c].next_sibling)
            if (t->nodes[c].count > 0) {
                *length = len;
                return at;
            }
    }
    *length = 0;
    return 0;
}

/* Candidates after node `from`: up to `most` nodes, best first by the product of the frequencies along their
 * path (a child's count over its parent's), none below `least`. Writes tokens[i], parents[i] (the index of the
 * candidate it follows, -1 for a child of `from`) and scores[i]; returns how many. With `chain`, only the most
 * frequent child at each step (a path). Ties go to the lower token id, so the result depends on the counts alone. */
VSK_API int vsk_suffix_candidates(const vsk_suffix *t, int64_t from, int most, double least, int chain, int32_t *tokens,
                                  int32_t *parents, double *scores) {
    int64_t *where = malloc(sizeof(int64_t) * (size_t)(most > 0 ? most : 1));
    int found = 0;
    if (!where) return 0;
    while (found < most) { /* best first over the frontier: every child of `from` and of the candidates so far */
        int64_t best = -1;
        int best_parent = -1;
        double best_score = least;
        const int first = chain && found ? found - 1 : -1; /* a chain grows from its last node only */
        for (int p = first; p < found; p++) {
            const int64_t at = p < 0 ? from : where[p];
            const double base = p < 0 ? 1.0 : scores[p];
            int64_t total = 0;
            for (int32_t c = t->nodes[at].first_child; c >= 0; c = t->nodes[c].next_sibling)
                total += t->nodes[c].count > 0 ? t->nodes[c].count : 0;
            for (int32_t c = t->nodes[at].first_child; c >= 0 && total > 0; c = t->nodes[c].next_sibling) {
                if (t->nodes[c].count <= 0) continue;
                int taken = 0;
                for (int q = 0; q < found && !taken; q++) taken = where[q] == c;
                const double score = base * (double)t->nodes[c].count / (double)total;
                const int better = score > best_score ||
                                   (score == best_score && best >= 0 && t->nodes[c].token < t->nodes[best].token);
                if (!taken && better) {
                    best = c;
                    best_parent = p;
                    best_score = score;
                }
            }
        }
        if (best < 0) break;
        where[found] = best;
        tokens[found] = t->nodes[best].token;
        parents[found] = best_parent;
        scores[found] = best_score;
        found++;
    }
    free(where);
    return found;
}
