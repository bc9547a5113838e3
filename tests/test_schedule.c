/* Schedules: the GPipe and 1F1B generators validate for many K and M; hand-broken schedules are
 * rejected at the right first action; the simulator's bubble, memory and step times against
 * formulas and hand-computed cases. */
#include <stdlib.h>
#include <string.h>

#include "plan/cells.h"
#include "plan/schedule.h"
#include "plan/simulate.h"
#include "plan/validate.h"
#include "testutil.h"

/* Index of the action (kind, mb) on stage k, or -1. */
static int find(const gp_schedule *s, int k, gp_action_kind kind, int mb) {
    for (int i = 0; i < s->stage[k].n; i++)
        if (s->stage[k].a[i].kind == kind && s->stage[k].a[i].mb == mb) return i;
    return -1;
}

static void remove_at(gp_schedule *s, int k, int i) {
    gp_stage_actions *st = &s->stage[k];
    memmove(st->a + i, st->a + i + 1, (size_t)(st->n - i - 1) * sizeof *st->a);
    st->n--;
}

static void insert_at(gp_schedule *s, int k, int i, gp_action_kind kind, int mb) {
    REQUIRE_OK(gp_schedule_push(s, k, kind, mb)); /* grows the list */
    gp_stage_actions *st = &s->stage[k];
    memmove(st->a + i + 1, st->a + i, (size_t)(st->n - 1 - i) * sizeof *st->a);
    st->a[i] = (gp_action){kind, mb, 0};
}

/* Builds a schedule from one string per stage: "F0 SA0 RG0 B0 STEP"; with V cells per stage
 * (placed in a loop) a letter after the micro-batch names the chunk: "F3b" is chunk 1's. */
static void build_chunks(gp_schedule *s, int K, int M, int V, const char *const *lines) {
    REQUIRE_OK(gp_schedule_init_chunks(s, K, M, V, GP_PLACE_LOOP));
    for (int k = 0; k < K; k++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", lines[k]);
        for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
            static const struct { const char *p; gp_action_kind k; } map[] = {
                {"SA", GP_ACT_SEND_ACT}, {"RA", GP_ACT_RECV_ACT}, {"SG", GP_ACT_SEND_GRAD},
                {"RG", GP_ACT_RECV_GRAD}, {"F", GP_ACT_FORWARD}, {"BI", GP_ACT_BACKWARD_INPUT},
                {"B", GP_ACT_BACKWARD}, {"W", GP_ACT_BACKWARD_WEIGHT}};
            if (strcmp(tok, "STEP") == 0) {
                REQUIRE_OK(gp_schedule_push(s, k, GP_ACT_OPTIMIZER_STEP, -1));
                continue;
            }
            for (size_t j = 0; j < sizeof map / sizeof *map; j++) {
                size_t n = strlen(map[j].p);
                if (strncmp(tok, map[j].p, n) == 0) {
                    const char last = tok[strlen(tok) - 1];
                    const int chunk = last >= 'b' && last <= 'z' ? last - 'a' : 0;
                    REQUIRE_OK(gp_schedule_push_chunk(s, k, chunk, map[j].k, atoi(tok + n)));
                    break;
                }
            }
        }
    }
}

static void build(gp_schedule *s, int K, int M, const char *const *lines) {
    build_chunks(s, K, M, 1, lines);
}

/* Expects validation to fail at (stage, index) with `needle` in the message. */
static void expect_fault(const gp_schedule *s, int cap, int stage, int index, const char *needle,
                         int line) {
    gp_schedule_fault f = {-1, -1};
    gp_status st = gp_schedule_validate(s, cap, &f);
    if (st != GP_INVALID_ARGUMENT || f.stage != stage || f.index != index ||
        !strstr(gp_last_error(), needle)) {
        fprintf(stderr,
                "line %d: expected a fault at stage %d, action %d with \"%s\"; got %s at "
                "stage %d, action %d: %s\n",
                line, stage, index, needle, gp_status_name(st), f.stage, f.index,
                gp_last_error());
        gp_test_failures++;
    }
}
#define EXPECT_FAULT(s, cap, stage, index, needle) \
    expect_fault((s), (cap), (stage), (index), (needle), __LINE__)

static void test_generators_valid(void) {
    for (int g = 0; g < 2; g++)
        for (int K = 1; K <= 5; K++)
            for (int M = 1; M <= 9; M++) {
                gp_schedule s = {0};
                const gp_schedule_kind kind = g ? GP_SCHEDULE_1F1B : GP_SCHEDULE_GPIPE;
                REQUIRE_OK(gp_schedule_generate(kind, K, M, 0, &s));
                for (int cap = 1; cap <= 2; cap++) {
                    gp_status st = gp_schedule_validate(&s, cap, NULL);
                    if (st != GP_OK) {
                        fprintf(stderr, "%s K %d M %d cap %d: %s\n", s.name, K, M, cap,
                                gp_last_error());
                        gp_test_failures++;
                    }
                }
                /* backwards in micro-batch order on every stage; one step, last */
                for (int k = 0; k < K; k++) {
                    int next = 0;
                    for (int i = 0; i < s.stage[k].n; i++)
                        if (s.stage[k].a[i].kind == GP_ACT_BACKWARD)
                            CHECK_EQ_INT(s.stage[k].a[i].mb, next++);
                    CHECK_EQ_INT(next, M);
                    CHECK_EQ_INT(s.stage[k].a[s.stage[k].n - 1].kind, GP_ACT_OPTIMIZER_STEP);
                    /* F, B per mb; a receive and a send per mb per neighbour */
                    int want = 2 * M + 1 + (k > 0 ? 2 * M : 0) + (k < K - 1 ? 2 * M : 0);
                    CHECK_EQ_INT(s.stage[k].n, want);
                }
                gp_schedule_free(&s);
            }
    gp_schedule s = {0};
    gp_schedule_kind kind = GP_SCHEDULE_ZBV;
    CHECK_FAILS(gp_schedule_kind_parse("zigzag", &kind), GP_INVALID_ARGUMENT,
                "expected gpipe, 1f1b, zbh1, interleaved or zbv");
    CHECK_EQ_INT(kind, GP_SCHEDULE_ZBV); /* untouched */
    for (int k = GP_SCHEDULE_GPIPE; k <= GP_SCHEDULE_ZBV; k++) {
        REQUIRE_OK(gp_schedule_kind_parse(gp_schedule_kind_name((gp_schedule_kind)k), &kind));
        CHECK_EQ_INT(kind, k);
    }
    CHECK_FAILS(gp_schedule_generate((gp_schedule_kind)5, 2, 2, 0, &s), GP_INVALID_ARGUMENT,
                "schedule 5: expected gpipe (0)");
    CHECK_FAILS(gp_schedule_gpipe(0, 2, &s), GP_INVALID_ARGUMENT, "K = 0");
    CHECK_FAILS(gp_schedule_1f1b(2, 0, &s), GP_INVALID_ARGUMENT, "M = 0");
    CHECK(s.stage == NULL);
}

static void test_printer(void) {
    gp_schedule s = {0};
    char buf[256];
    REQUIRE_OK(gp_schedule_gpipe(2, 2, &s));
    CHECK(strcmp(gp_schedule_stage_str(&s, 0, buf, sizeof buf),
                 "F0 SA0 F1 SA1 RG0 B0 RG1 B1 STEP") == 0);
    CHECK(strcmp(gp_schedule_stage_str(&s, 1, buf, sizeof buf),
                 "RA0 F0 RA1 F1 B0 SG0 B1 SG1 STEP") == 0);
    gp_schedule_free(&s);
    REQUIRE_OK(gp_schedule_1f1b(3, 4, &s));
    CHECK(strcmp(gp_schedule_stage_str(&s, 0, buf, sizeof buf),
                 "F0 SA0 F1 SA1 F2 SA2 RG0 B0 F3 SA3 RG1 B1 RG2 B2 RG3 B3 STEP") == 0);
    CHECK(strcmp(gp_schedule_stage_str(&s, 2, buf, sizeof buf),
                 "RA0 F0 B0 SG0 RA1 F1 B1 SG1 RA2 F2 B2 SG2 RA3 F3 B3 SG3 STEP") == 0);
    char small[12];
    gp_schedule_stage_str(&s, 0, small, sizeof small);
    CHECK(strlen(small) == 11 && strcmp(small + 8, "...") == 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE_OK(f ? GP_OK : GP_IO);
    gp_schedule_print(&s, f);
    fclose(f);
    CHECK(strstr(text, "schedule 1f1b: K = 3 stages, M = 4 micro-batches\nstage 0: F0 SA0") ==
          text);
    CHECK(strstr(text, "\nstage 2: RA0 F0 B0 SG0") != NULL);
    free(text);
    char act[32];
    CHECK(strcmp(gp_action_str((gp_action){GP_ACT_RECV_GRAD, 3, 0}, act, sizeof act),
                 "RECV_GRAD(3)") == 0);
    gp_schedule_free(&s);
}

static void test_broken(void) {
    gp_schedule s = {0};
    /* a missing backward: the step notices it (stage 0 sends no gradient) */
    REQUIRE_OK(gp_schedule_gpipe(3, 4, &s));
    remove_at(&s, 0, find(&s, 0, GP_ACT_BACKWARD, 3));
    EXPECT_FAULT(&s, 1, 0, s.stage[0].n - 1,
                 "OPTIMIZER_STEP: comes before BACKWARD(3), which is missing");
    gp_schedule_free(&s);
    /* ... on a middle stage the send of its gradient comes first */
    REQUIRE_OK(gp_schedule_gpipe(3, 4, &s));
    remove_at(&s, 1, find(&s, 1, GP_ACT_BACKWARD, 1));
    EXPECT_FAULT(&s, 1, 1, find(&s, 1, GP_ACT_SEND_GRAD, 1),
                 "SEND_GRAD(1): comes before BACKWARD(1), which produces it");
    gp_schedule_free(&s);
    /* backwards out of micro-batch order (the classic reversed drain) */
    build(&s, 2, 3, (const char *const[]){
        "F0 SA0 F1 SA1 F2 SA2 RG2 B2 RG1 B1 RG0 B0 STEP",
        "RA0 F0 RA1 F1 RA2 F2 B2 SG2 B1 SG1 B0 SG0 STEP"});
    EXPECT_FAULT(&s, 1, 0, 7, "BACKWARD(2): backwards must run in micro-batch order 0..2");
    CHECK(strstr(gp_last_error(), "expected BACKWARD(0) here") != NULL);
    CHECK(strstr(gp_last_error(), "[stage 0: ... SA0 F1 SA1 F2 SA2 RG2 [B2] RG1 B1 RG0 ...]") !=
          NULL);
    gp_schedule_free(&s);
    /* an unmatched send: twice, from the last stage, gradients from the first */
    REQUIRE_OK(gp_schedule_gpipe(2, 3, &s));
    insert_at(&s, 0, 2, GP_ACT_SEND_ACT, 0);
    EXPECT_FAULT(&s, 1, 0, 2, "SEND_ACT(0): micro-batch 0 already had this action at action 1");
    gp_schedule_free(&s);
    REQUIRE_OK(gp_schedule_gpipe(2, 3, &s));
    insert_at(&s, 1, 2, GP_ACT_SEND_ACT, 0);
    EXPECT_FAULT(&s, 1, 1, 2, "the last stage has no next stage");
    insert_at(&s, 0, 0, GP_ACT_SEND_GRAD, 0);
    EXPECT_FAULT(&s, 1, 0, 0, "SEND_GRAD(0): the first stage has no previous stage");
    gp_schedule_free(&s);
    /* a send that is never made: the receiver waits for it */
    REQUIRE_OK(gp_schedule_gpipe(2, 3, &s));
    remove_at(&s, 1, find(&s, 1, GP_ACT_SEND_GRAD, 2));
    EXPECT_FAULT(&s, 1, 1, s.stage[1].n - 1, "comes before SEND_GRAD(2), which is missing");
    gp_schedule_free(&s);
    /* a receive for the wrong micro-batch: stage 1 takes 0, 2, 1 but stage 0 sends 0, 1, 2 */
    build(&s, 2, 3, (const char *const[]){
        "F0 SA0 F1 SA1 F2 SA2 RG0 B0 RG1 B1 RG2 B2 STEP",
        "RA0 F0 RA2 F2 RA1 F1 B0 SG0 B1 SG1 B2 SG2 STEP"});
    EXPECT_FAULT(&s, 1, 1, 2, "RECV_ACT(2): takes message #1 from stage 0, which is SEND_ACT(1)");
    gp_schedule_free(&s);
    build(&s, 2, 3, (const char *const[]){
        "F0 SA0 F1 SA1 F2 SA2 RG1 RG0 B0 B1 RG2 B2 STEP",
        "RA0 F0 RA1 F1 RA2 F2 B0 SG0 B1 SG1 B2 SG2 STEP"});
    EXPECT_FAULT(&s, 2, 0, 6, "RECV_GRAD(1): takes message #0 from stage 1, which is SEND_GRAD(0)");
    gp_schedule_free(&s);
    /* a forward before its receive; a receive on the first stage; mb out of range */
    build(&s, 2, 1, (const char *const[]){"F0 SA0 RG0 B0 STEP", "F0 RA0 B0 SG0 STEP"});
    EXPECT_FAULT(&s, 1, 1, 0, "FORWARD(0): needs RECV_ACT(0) before it");
    gp_schedule_free(&s);
    build(&s, 2, 1, (const char *const[]){"RA0 F0 SA0 RG0 B0 STEP", "RA0 F0 B0 SG0 STEP"});
    EXPECT_FAULT(&s, 1, 0, 0, "first stage reads the inputs");
    gp_schedule_free(&s);
    build(&s, 1, 2, (const char *const[]){"F0 F2 B0 B1 STEP"});
    EXPECT_FAULT(&s, 1, 0, 1, "micro-batch 2 is outside 0..1");
    gp_schedule_free(&s);
    /* step: missing at the end, or not last */
    build(&s, 1, 1, (const char *const[]){"F0 B0"});
    EXPECT_FAULT(&s, 1, 0, 2, "(end of list): the list ends without an OPTIMIZER_STEP");
    gp_schedule_free(&s);
    build(&s, 1, 1, (const char *const[]){"F0 B0 STEP STEP"});
    EXPECT_FAULT(&s, 1, 0, 3, "comes after OPTIMIZER_STEP (action 2)");
    gp_schedule_free(&s);
    /* a cyclic wait: both stages receive before they send */
    build(&s, 2, 1, (const char *const[]){"RG0 F0 SA0 B0 STEP", "RA0 F0 B0 SG0 STEP"});
    EXPECT_FAULT(&s, 1, 0, 0, "RECV_GRAD(0): deadlock with mailboxes of capacity 1");
    CHECK(strstr(gp_last_error(), "stage 1 at action 0 RECV_ACT(0) waits for stage 0 (nothing "
                                  "sent yet)") != NULL);
    gp_schedule_free(&s);
    /* a wait that mailboxes of 2 resolve but mailboxes of 1 do not: stage 0 pushes all
     * activations before it takes a gradient; stage 1 sends two gradients before its third
     * activation. */
    build(&s, 2, 4, (const char *const[]){
        "F0 SA0 F1 SA1 F2 SA2 F3 SA3 RG0 B0 RG1 B1 RG2 B2 RG3 B3 STEP",
        "RA0 F0 RA1 F1 B0 SG0 B1 SG1 RA2 F2 RA3 F3 B2 SG2 B3 SG3 STEP"});
    CHECK_OK(gp_schedule_validate(&s, 2, NULL));
    EXPECT_FAULT(&s, 1, 0, 7, "SEND_ACT(3): deadlock with mailboxes of capacity 1");
    CHECK(strstr(gp_last_error(), "stage 1 at action 7 SEND_GRAD(1) waits for stage 0 (mailbox "
                                  "full)") != NULL);
    CHECK_FAILS(gp_schedule_validate(&s, 0, NULL), GP_INVALID_ARGUMENT, "capacity 0");
    gp_schedule_free(&s);
}

/* Equal cells: fwd 1, bwd 2. */
static void equal_cells(gp_sim_cell *c, int K, uint64_t in, uint64_t state) {
    for (int k = 0; k < K; k++)
        c[k] = (gp_sim_cell){.fwd_time = 1, .bwd_time = 2, .in_bytes = in, .state_bytes = state};
}

static void test_bubble_and_memory(void) {
    gp_sim_cell cells[5];
    gp_sim_stage st[5];
    gp_sim_result res;
    for (int K = 1; K <= 5; K++)
        for (int M = 1; M <= 9; M++) {
            equal_cells(cells, K, 100, 1000);
            gp_schedule g = {0}, f = {0};
            REQUIRE_OK(gp_schedule_gpipe(K, M, &g));
            REQUIRE_OK(gp_schedule_1f1b(K, M, &f));
            for (int v = 0; v < 4; v++) {
                /* mailboxes of 1 or 2 give the same times here */
                gp_sim_opts o = {.capacity = 1 + v / 2, .remat = (gp_remat)(v % 2)};
                REQUIRE_OK(gp_schedule_simulate(&g, cells, &o, st, &res));
                /* (M + K - 1) slots of forward + backward (+ recompute) */
                double slot = 1 + 2 + (o.remat == GP_REMAT_CELL ? 1 : 0);
                CHECK(res.step_time == (double)(M + K - 1) * slot);
                CHECK(res.bubble == (double)(K - 1) / (double)(M + K - 1));
                for (int k = 0; k < K; k++) {
                    CHECK_EQ_INT(st[k].peak_in_flight, M);
                    CHECK(st[k].busy == M * slot);
                    CHECK(st[k].recompute == (o.remat == GP_REMAT_CELL ? M : 0));
                    /* fill-drain holds all M: the memory model's figure with in_flight = M */
                    gp_layer_est one = {.in_bytes = 100, .out_bytes = 1000};
                    gp_cell_mem cm = gp_cell_memory(&one, 0, 1, 1, M, o.remat);
                    CHECK_EQ_INT(st[k].peak_act_bytes, cm.stash + cm.work);
                }
                REQUIRE_OK(gp_schedule_simulate(&f, cells, &o, st, &res));
                CHECK_EQ_INT(st[0].peak_in_flight, M < K ? M : K);
                for (int k = 0; k < K; k++) {
                    int want = M < K - k ? M : K - k;
                    CHECK_EQ_INT(st[k].peak_in_flight, want);
                    gp_layer_est one = {.in_bytes = 100, .out_bytes = 1000};
                    gp_cell_mem cm = gp_cell_memory(&one, 0, 1, 1, want, o.remat);
                    CHECK_EQ_INT(st[k].peak_act_bytes, cm.stash + cm.work);
                }
                /* balanced 1F1B has the same bubble as fill-drain */
                CHECK_NEAR(res.bubble, (double)(K - 1) / (double)(M + K - 1), 1e-12);
            }
            gp_schedule_free(&g);
            gp_schedule_free(&f);
        }
}

/* The cells' profiles against the simulation, for every schedule, remat mode and many cell
 * figures: with one cell per stage its largest point is the stage's simulated peak exactly (the
 * partitioner's check is the plan's); with several, each cell's is at least its share of the
 * peak, and together at least the peak. */
static void test_stash_profiles(void) {
    int exact = 0;
    for (int kind = 0; kind <= GP_SCHEDULE_ZBV; kind++)
        for (int K = 1; K <= 4; K++)
            for (int M = 1; M <= 8; M++)
                for (int V = 1; V <= 3; V++) {
                    const bool chunked = kind == GP_SCHEDULE_INTERLEAVED || kind == GP_SCHEDULE_ZBV;
                    if (chunked != (V > 1) || (kind == GP_SCHEDULE_ZBV && V != 2)) continue;
                    if (kind == GP_SCHEDULE_INTERLEAVED && M % K) continue;
                    gp_schedule s = {0};
                    REQUIRE_OK(gp_schedule_generate((gp_schedule_kind)kind, K, M, V, &s));
                    const int C = K * V;
                    gp_stash_profile prof[12] = {{0}};
                    REQUIRE_OK(gp_stash_profiles(&s, prof));
                    for (int trial = 0; trial < 4; trial++) {
                        gp_sim_cell cells[12];
                        gp_layer_est one[12];
                        gp_remat rm[12];
                        for (int c = 0; c < C; c++) {
                            const uint64_t in = 10 + 7 * (uint64_t)((c + trial) % 5);
                            const uint64_t state = 1 + 97 * (uint64_t)((3 * c + trial) % 4);
                            const uint64_t keep = 13 * (uint64_t)((c + 2 * trial) % 3);
                            cells[c] = (gp_sim_cell){.fwd_time = 1, .bwd_time = 2, .wgt_time = 1,
                                                     .in_bytes = in, .state_bytes = state,
                                                     .keep_bytes = keep};
                            one[c] = (gp_layer_est){.in_bytes = in, .out_bytes = state,
                                                    .keep_bytes = keep};
                            rm[c] = (gp_remat)((c + trial) % 2);
                        }
                        gp_sim_opts o = {.capacity = 2, .cell_remat = rm};
                        gp_sim_stage st[4];
                        gp_sim_result res;
                        REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &res));
                        const bool split = gp_schedule_kind_splits((gp_schedule_kind)kind);
                        for (int k = 0; k < K; k++) {
                            uint64_t sum = 0;
                            for (int v = 0; v < V; v++) {
                                const int c = gp_schedule_cell(&s, k, v);
                                gp_cell_mem cm =
                                    gp_cell_memory_at(&one[c], 0, 1, 1, &prof[c], rm[c], split);
                                CHECK(cm.stash + cm.work >= st[k].peak_chunk_bytes[v]);
                                sum += cm.stash + cm.work;
                            }
                            if (V == 1) {
                                CHECK_EQ_INT(sum, st[k].peak_act_bytes);
                                exact++;
                            } else {
                                CHECK(sum >= st[k].peak_act_bytes);
                            }
                        }
                    }
                    gp_stash_profiles_free(prof, C);
                    gp_schedule_free(&s);
                }
    CHECK(exact > 300);
}

static void test_hand_computed(void) {
    /* K = 2, M = 2, mailboxes of 1: stage 0 forward 1, backward 3; stage 1 forward 2,
     * backward 4. By hand (see the timeline):
     *   stage 0: F0 [0,1] F1 [1,2] (SA1 waits for RA0 at 1)  RG0 waits to 9: B0 [9,12]
     *            RG1 waits to 13 (SG1 waits until stage 0 took SG0 at 9): B1 [13,16]
     *   stage 1: RA0 1, F0 [1,3], F1 [3,5], B0 [5,9], B1 [9,13]
     * step 16; busy 8 and 12; idle 8 and 4; bubble 12 / 32. */
    gp_sim_cell cells[2] = {{.fwd_time = 1, .bwd_time = 3}, {.fwd_time = 2, .bwd_time = 4}};
    gp_sim_stage st[2];
    gp_sim_result res;
    gp_schedule s = {0};
    REQUIRE_OK(gp_schedule_gpipe(2, 2, &s));
    gp_sim_opts o = {.capacity = 1, .remat = GP_REMAT_NONE};
    REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &res));
    CHECK(res.step_time == 16);
    CHECK(st[0].busy == 8 && st[1].busy == 12);
    CHECK(st[0].idle == 8 && st[1].idle == 4);
    CHECK(st[0].end == 16 && st[1].end == 13);
    CHECK(res.bubble == 12.0 / 32.0);
    /* latency 0.5 on every message: stage 1 starts at 1.5, its B1 ends at 13.5, SG1 arrives at
     * 14, so stage 0's B1 runs [14, 17]. */
    o.latency = 0.5;
    REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &res));
    CHECK(res.step_time == 17);
    CHECK(st[1].end == 13.5);
    /* re-materialization: each backward also recomputes the forward: stage 1 F [1,3] [3,5],
     * B [5,11] [11,17]; stage 0 B0 [11,15], B1 waits for SG1 at 17: [17,21]. Options left
     * zero get it: CELL is the zero value of the public gp_remat, GPipe's default. */
    o = (gp_sim_opts){.capacity = 1};
    REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &res));
    CHECK(res.step_time == 21);
    CHECK(st[0].recompute == 2 && st[1].recompute == 4);
    /* per stage (selective remat): stage 1 as above, stage 0 keeps its state: B0 [11,14], B1
     * waits for SG1 at 17: [17,20] */
    const gp_remat mixed[2] = {GP_REMAT_NONE, GP_REMAT_CELL};
    gp_sim_cell sized[2] = {cells[0], cells[1]};
    sized[0].in_bytes = 10, sized[0].state_bytes = 100;
    sized[1].in_bytes = 20, sized[1].state_bytes = 300;
    o = (gp_sim_opts){.capacity = 1, .cell_remat = mixed};
    REQUIRE_OK(gp_schedule_simulate(&s, sized, &o, st, &res));
    CHECK(res.step_time == 20);
    CHECK(st[0].recompute == 0 && st[1].recompute == 4);
    CHECK_EQ_INT(st[0].peak_act_bytes, 2 * (10 + 100)); /* both micro-batches' input and state */
    CHECK_EQ_INT(st[1].peak_act_bytes, 2 * 20 + 300);   /* both inputs, one state rebuilt */
    const gp_remat bad_stage[2] = {GP_REMAT_NONE, GP_REMAT_SELECTIVE};
    o.cell_remat = bad_stage;
    CHECK_FAILS(gp_schedule_simulate(&s, cells, &o, st, &res), GP_INVALID_ARGUMENT,
                "unknown remat mode 2 of a stage");
    o = (gp_sim_opts){.capacity = 1};
    gp_schedule_free(&s);
    /* 1F1B, same cells: stage 1 runs F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13]; stage 0 B0 [7,10],
     * B1 [13,16]: the same 16, with one micro-batch in flight on stage 1. */
    REQUIRE_OK(gp_schedule_1f1b(2, 2, &s));
    o = (gp_sim_opts){.capacity = 1, .remat = GP_REMAT_NONE};
    REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &res));
    CHECK(res.step_time == 16);
    CHECK(st[1].end == 13);
    CHECK_EQ_INT(st[1].peak_in_flight, 1);
    CHECK_EQ_INT(st[0].peak_in_flight, 2);
    gp_schedule_free(&s);
    /* Replaying per-micro-batch durations (GPipe): stage 1's second backward takes 8, not 4:
     * stage 1 B0 [5,9] B1 [9,17]; stage 0 B0 [9,12], B1 waits for SG1 at 17: [17,20]. */
    REQUIRE_OK(gp_schedule_gpipe(2, 2, &s));
    const double bwd1[2] = {4, 8}, re1[2] = {0.5, 0.5};
    gp_sim_cell slow[2] = {cells[0], cells[1]};
    slow[1].bwd_mb = bwd1;
    REQUIRE_OK(gp_schedule_simulate(&s, slow, &o, st, &res));
    CHECK(res.step_time == 20);
    CHECK(st[1].busy == 16);
    /* ... and its recomputations measured at 0.5 each instead of its mean forward of 2: stage 1
     * B0 [5,9.5] B1 [9.5,18]; stage 0 (means: recompute 1 + backward 3) B0 [9.5,13.5] B1 [18,22]. */
    slow[1].recompute_mb = re1;
    o.remat = GP_REMAT_CELL;
    REQUIRE_OK(gp_schedule_simulate(&s, slow, &o, st, &res));
    CHECK(res.step_time == 22);
    CHECK(st[1].recompute == 1 && st[0].recompute == 2);
    o.remat = GP_REMAT_NONE;
    /* bad inputs */
    cells[1].bwd_time = -1;
    CHECK_FAILS(gp_schedule_simulate(&s, cells, &o, st, &res), GP_INVALID_ARGUMENT, "cell 1");
    cells[1].bwd_time = 4;
    o.latency = -1;
    CHECK_FAILS(gp_schedule_simulate(&s, cells, &o, st, &res), GP_INVALID_ARGUMENT, "latency");
    o.latency = 0;
    o.remat = (gp_remat)2;
    CHECK_FAILS(gp_schedule_simulate(&s, cells, &o, st, &res), GP_INVALID_ARGUMENT,
                "unknown remat mode 2 (expected 0 cell or 1 none)");
    o.remat = GP_REMAT_NONE;
    gp_schedule_free(&s);
    /* an invalid schedule is not simulated */
    build(&s, 2, 1, (const char *const[]){"RG0 F0 SA0 B0 STEP", "RA0 F0 B0 SG0 STEP"});
    o.latency = 0;
    CHECK_FAILS(gp_schedule_simulate(&s, cells, &o, st, &res), GP_INVALID_ARGUMENT, "deadlock");
    gp_schedule_free(&s);
    /* cell figures from layers */
    gp_layer_est ly[3] = {{.fwd_time = 1, .bwd_time = 2, .in_bytes = 8, .out_bytes = 4,
                           .saved_bytes = 1},
                          {.fwd_time = 3, .bwd_time = 5, .in_bytes = 4, .out_bytes = 2},
                          {.fwd_time = 7, .in_bytes = 2}};
    gp_sim_cell c = gp_sim_cell_from_layers(ly, 0, 2);
    CHECK(c.fwd_time == 4 && c.bwd_time == 7);
    CHECK_EQ_INT(c.in_bytes, 8);
    CHECK_EQ_INT(c.state_bytes, 7);
    CHECK_EQ_INT(c.state_bytes, gp_cell_memory(ly, 0, 2, 2, 1, GP_REMAT_CELL).work);
}

/* ZB-H1: valid for K up to 8 with mailboxes of 1 and 2; on every stage each micro-batch's
 * forward, input backward and weight part once, both backward parts in micro-batch order;
 * 1F1B's bound on forwards not yet backwarded; at unit costs (F = B = W) a step of 3M + K - 1
 * for M >= K: its idle time a third of 1F1B's (Qi et al.'s (K-1)(F+B-W) against
 * (K-1)(F+B+W)). */
static void test_zbh1(void) {
    for (int K = 1; K <= 8; K++)
        for (int M = 1; M <= 32; M += M < 8 ? 1 : 8) {
            gp_schedule z = {0}, f = {0};
            REQUIRE_OK(gp_schedule_zbh1(K, M, &z));
            REQUIRE_OK(gp_schedule_1f1b(K, M, &f));
            for (int cap = 1; cap <= 2; cap++)
                if (gp_schedule_validate(&z, cap, NULL) != GP_OK) {
                    fprintf(stderr, "zbh1 K %d M %d cap %d: %s\n", K, M, cap, gp_last_error());
                    gp_test_failures++;
                }
            for (int k = 0; k < K; k++) {
                int nb = 0, nw = 0, nf = 0;
                for (int i = 0; i < z.stage[k].n; i++) {
                    const gp_action a = z.stage[k].a[i];
                    CHECK(a.kind != GP_ACT_BACKWARD);
                    if (a.kind == GP_ACT_FORWARD) nf++;
                    if (a.kind == GP_ACT_BACKWARD_INPUT) CHECK_EQ_INT(a.mb, nb++);
                    if (a.kind == GP_ACT_BACKWARD_WEIGHT) CHECK_EQ_INT(a.mb, nw++);
                    CHECK(nf - nb <= (K - k < M ? K - k : M));
                }
                CHECK(nf == M && nb == M && nw == M);
            }
            gp_sim_cell cells[8];
            for (int k = 0; k < K; k++)
                cells[k] = (gp_sim_cell){.fwd_time = 1, .bwd_time = 2, .wgt_time = 1};
            gp_sim_stage st[8];
            gp_sim_result rz, rf;
            const gp_sim_opts o = {.capacity = 2, .remat = GP_REMAT_NONE};
            REQUIRE_OK(gp_schedule_simulate(&z, cells, &o, st, &rz));
            REQUIRE_OK(gp_schedule_simulate(&f, cells, &o, st, &rf));
            if (M >= K) {
                CHECK(rz.step_time == 3 * M + K - 1);
                CHECK(rf.step_time == 3 * M + 3 * (K - 1));
            }
            CHECK(rz.step_time <= rf.step_time);
            gp_schedule_free(&z);
            gp_schedule_free(&f);
        }
}

/* Interleaved 1F1B: valid for K up to 8, V = 2..4 and M = K..8K with mailboxes of 1 and 2;
 * every stage runs each (chunk, micro-batch) forward and backward once, each cell's backwards
 * in micro-batch order; at unit costs per cell (F = 1/V, B = 2/V: a stage's V cells cost one
 * 1F1B cell) the step is 3M + 3(K-1)/V, a V-th of 1F1B's idle time, and the bubble is
 * (K-1)/(VM+K-1). Cells and places round-trip in both placements. */
static void test_interleaved(void) {
    for (int K = 1; K <= 8; K++)
        for (int V = 2; V <= 4; V++)
            for (int M = K; M <= 8 * K; M *= 2) {
                gp_schedule s = {0}, f = {0};
                REQUIRE_OK(gp_schedule_interleaved(K, M, V, &s));
                REQUIRE_OK(gp_schedule_1f1b(K, M, &f));
                CHECK_EQ_INT(gp_schedule_cells(&s), K * V);
                for (int cap = 1; cap <= 2; cap++)
                    if (gp_schedule_validate(&s, cap, NULL) != GP_OK) {
                        fprintf(stderr, "interleaved K %d M %d V %d cap %d: %s\n", K, M, V, cap,
                                gp_last_error());
                        gp_test_failures++;
                    }
                for (int k = 0; k < K; k++) {
                    int nf[4] = {0}, nb[4] = {0};
                    for (int i = 0; i < s.stage[k].n; i++) {
                        const gp_action a = s.stage[k].a[i];
                        if (a.kind == GP_ACT_OPTIMIZER_STEP) continue;
                        CHECK(a.chunk >= 0 && a.chunk < V);
                        if (a.kind == GP_ACT_FORWARD) nf[a.chunk]++;
                        if (a.kind == GP_ACT_BACKWARD) CHECK_EQ_INT(a.mb, nb[a.chunk]++);
                    }
                    for (int v = 0; v < V; v++) CHECK(nf[v] == M && nb[v] == M);
                }
                gp_sim_cell cells[32];
                for (int c = 0; c < K * V; c++)
                    cells[c] = (gp_sim_cell){.fwd_time = 1.0 / V, .bwd_time = 2.0 / V};
                gp_sim_stage st[8];
                gp_sim_result r, rf;
                const gp_sim_opts o = {.capacity = 2, .remat = GP_REMAT_NONE};
                REQUIRE_OK(gp_schedule_simulate(&s, cells, &o, st, &r));
                for (int c = 0; c < K; c++) cells[c] = (gp_sim_cell){.fwd_time = 1, .bwd_time = 2};
                REQUIRE_OK(gp_schedule_simulate(&f, cells, &o, st, &rf));
                CHECK(fabs(r.step_time - (3.0 * M + 3.0 * (K - 1) / V)) < 1e-9);
                CHECK(fabs(rf.step_time - (3.0 * M + 3.0 * (K - 1))) < 1e-9);
                CHECK(fabs(r.bubble - (double)(K - 1) / (V * M + K - 1)) < 1e-9);
                gp_schedule_free(&s);
                gp_schedule_free(&f);
            }
    gp_schedule s = {0};
    CHECK_FAILS(gp_schedule_interleaved(2, 3, 2, &s), GP_INVALID_ARGUMENT,
                "M = 3 micro-batches is not a multiple of K = 2 stages");
    CHECK_FAILS(gp_schedule_generate(GP_SCHEDULE_1F1B, 2, 4, 2, &s), GP_INVALID_ARGUMENT,
                "schedule 1f1b with 2 cells per stage");
    CHECK_FAILS(gp_schedule_init_chunks(&s, 2, 4, 3, GP_PLACE_V_SHAPE), GP_INVALID_ARGUMENT,
                "V = 3 cells per stage placed in a V");
    REQUIRE_OK(gp_schedule_generate(GP_SCHEDULE_INTERLEAVED, 2, 4, 0, &s)); /* default V = 2 */
    CHECK_EQ_INT(s.chunks, 2);
    gp_schedule_free(&s);
    for (int place = 0; place < 2; place++) {
        REQUIRE_OK(gp_schedule_init_chunks(&s, 3, 1, 2, (gp_placement)place));
        for (int c = 0; c < 6; c++) {
            int k, v;
            gp_schedule_place(&s, c, &k, &v);
            CHECK_EQ_INT(gp_schedule_cell(&s, k, v), c);
            /* a loop goes round the stages; a V comes back up: cell 5 on stage 0 */
            CHECK_EQ_INT(k, place == GP_PLACE_LOOP || c < 3 ? c % 3 : 5 - c);
        }
        gp_schedule_free(&s);
    }
}

/* ZBV: valid for K up to 8 and M up to 32 with the runtime's mailboxes of 2 (it is built for
 * them: a cell sends while fewer than 2 of its messages wait); two cells per stage in a
 * V (stage k runs cells k and 2K - 1 - k); every cell runs each micro-batch's forward, input
 * backward and weight part once, both backward parts in micro-batch order; each stage holds at
 * most 2K half-cell micro-batches between forward and input backward (1F1B's first stage's
 * memory); at unit costs (a cell half of ZB-H1's: F = B = W = 1/2) never slower than ZB-H1,
 * with at most 3/4 of its idle time for M >= K >= 2, and for M >= 2K a step of 3M + (K-1)/2: no
 * idle time but the pipeline's fill (half of ZB-H1's). A message between the two cells of stage
 * K - 1 is taken right after it is sent. */
static void test_zbv(void) {
    double worst_ratio = 0;
    for (int K = 1; K <= 8; K++)
        for (int M = 1; M <= 32; M += M < 8 ? 1 : 8) {
            gp_schedule v = {0}, z = {0};
            REQUIRE_OK(gp_schedule_zbv(K, M, &v));
            REQUIRE_OK(gp_schedule_zbh1(K, M, &z));
            CHECK(v.chunks == 2 && v.placement == GP_PLACE_V_SHAPE);
            if (gp_schedule_validate(&v, GP_MAILBOX_CAPACITY, NULL) != GP_OK) {
                fprintf(stderr, "zbv K %d M %d: %s\n", K, M, gp_last_error());
                gp_test_failures++;
            }
            for (int k = 0; k < K; k++) {
                int nf[2] = {0}, nb[2] = {0}, nw[2] = {0}, in_flight = 0;
                for (int i = 0; i < v.stage[k].n; i++) {
                    const gp_action a = v.stage[k].a[i];
                    if (a.kind == GP_ACT_OPTIMIZER_STEP) continue;
                    CHECK(a.kind != GP_ACT_BACKWARD && a.chunk >= 0 && a.chunk < 2);
                    const int c = a.chunk & 1;
                    if (a.kind == GP_ACT_FORWARD) nf[c]++, in_flight++;
                    if (a.kind == GP_ACT_BACKWARD_INPUT) {
                        CHECK_EQ_INT(a.mb, nb[c]++);
                        in_flight--;
                    }
                    if (a.kind == GP_ACT_BACKWARD_WEIGHT) CHECK_EQ_INT(a.mb, nw[c]++);
                    CHECK(in_flight <= 2 * (K < M ? K : M));
                    if (a.kind == GP_ACT_SEND_ACT && k == K - 1 && a.chunk == 0) {
                        const gp_action r = v.stage[k].a[i + 1]; /* the V's turn */
                        CHECK(r.kind == GP_ACT_RECV_ACT && r.mb == a.mb && r.chunk == 1);
                    }
                }
                for (int c = 0; c < 2; c++) CHECK(nf[c] == M && nb[c] == M && nw[c] == M);
            }
            gp_sim_cell cells[16];
            for (int c = 0; c < 2 * K; c++)
                cells[c] = (gp_sim_cell){.fwd_time = 0.5, .bwd_time = 1, .wgt_time = 0.5};
            gp_sim_stage st[8];
            gp_sim_result rv, rz;
            const gp_sim_opts o = {.capacity = 2, .remat = GP_REMAT_NONE};
            REQUIRE_OK(gp_schedule_simulate(&v, cells, &o, st, &rv));
            for (int c = 0; c < K; c++)
                cells[c] = (gp_sim_cell){.fwd_time = 1, .bwd_time = 2, .wgt_time = 1};
            REQUIRE_OK(gp_schedule_simulate(&z, cells, &o, st, &rz));
            CHECK(rv.step_time <= rz.step_time);
            if (M >= K && K >= 2) {
                const double ratio = (rv.step_time - 3.0 * M) / (rz.step_time - 3.0 * M);
                CHECK(ratio <= 0.75 + 1e-12);
                /* M >= 2K: no idle but the fill, the first forward's way down to the last
                 * stage, (K-1) half-cell forwards: no schedule can start that stage sooner */
                if (M >= 2 * K) CHECK(fabs(rv.step_time - (3.0 * M + (K - 1) * 0.5)) < 1e-9);
                if (ratio > worst_ratio) worst_ratio = ratio;
            }
            gp_schedule_free(&v);
            gp_schedule_free(&z);
        }
    printf("zbv: at unit costs at most %.3f of zbh1's idle time (M >= K >= 2)\n", worst_ratio);
    /* one stage: both cells on it, the turn of the V a message to itself, taken back at once; a
     * receive put before its send waits on the stage itself */
    gp_schedule s = {0};
    REQUIRE_OK(gp_schedule_zbv(1, 1, &s));
    char text[128];
    CHECK(strcmp(gp_schedule_stage_str(&s, 0, text, sizeof text),
                 "F0 SA0 RA0b F0b BI0b SG0b RG0 BI0 W0b W0 STEP") == 0);
    gp_schedule_free(&s);
    /* (one stage: a V places its two cells as a loop does) */
    gp_schedule_free(&s);
    build_chunks(&s, 1, 1, 2, (const char *const[]){"F0 RA0b SA0 F0b BI0b SG0b RG0 BI0 W0b W0 STEP"});
    EXPECT_FAULT(&s, 1, 0, 1, "deadlock");
    CHECK(strstr(gp_last_error(), "waits for stage 0 (nothing sent yet)") != NULL);
    gp_schedule_free(&s);
}

/* Hand-broken interleaved schedules: each rule of the validator names the cell. K = 2 stages,
 * V = 2: cells 0 (stage 0), 1 (stage 1), 2 (stage 0, chunk 1), 3 (stage 1, chunk 1). */
static void test_broken_interleaved(void) {
    gp_schedule s = {0};
    const char *const good[2] = {"F0 SA0 RA0b F0b SA0b RG0b B0b SG0b RG0 B0 STEP",
                                 "RA0 F0 SA0 RA0b F0b B0b SG0b RG0 B0 SG0 STEP"};
    build_chunks(&s, 2, 1, 2, good);
    CHECK_OK(gp_schedule_validate(&s, 1, NULL));
    gp_schedule_free(&s);
    /* a chunk the stage does not run */
    build_chunks(&s, 2, 1, 2, (const char *const[]){
        "F0 SA0 RA0c F0b SA0b RG0b B0b SG0b RG0 B0 STEP", good[1]});
    EXPECT_FAULT(&s, 1, 0, 2, "chunk 2 is outside 0..1");
    gp_schedule_free(&s);
    /* the wrap-around receive (cell 1 on stage 1 feeds cell 2 on stage 0) left out */
    build_chunks(&s, 2, 1, 2, (const char *const[]){
        "F0 SA0 F0b SA0b RG0b B0b SG0b RG0 B0 STEP", good[1]});
    EXPECT_FAULT(&s, 1, 0, 2, "FORWARD(0, chunk 1): needs RECV_ACT(0) before it (its input "
                              "comes from cell 1 (stage 1, chunk 0))");
    gp_schedule_free(&s);
    /* the last cell sends no activation */
    build_chunks(&s, 2, 1, 2, (const char *const[]){
        good[0], "RA0 F0 SA0 RA0b F0b SA0b B0b SG0b RG0 B0 SG0 STEP"});
    EXPECT_FAULT(&s, 1, 1, 5, "the last cell has no next cell to send activations to");
    gp_schedule_free(&s);
    /* a cell's backwards out of micro-batch order (one stage, two cells) */
    build_chunks(&s, 1, 2, 2, (const char *const[]){
        "F0 SA0 F1 SA1 RA0b F0b RA1b F1b B1b SG1b B0b SG0b RG0 B0 RG1 B1 STEP"});
    EXPECT_FAULT(&s, 1, 0, 8, "BACKWARD(1, chunk 1): backwards must run in micro-batch order "
                              "0..1 on every cell");
    gp_schedule_free(&s);
    /* stage 0 waits for cell 1's output before sending cell 1 its input */
    build_chunks(&s, 2, 1, 2, (const char *const[]){
        "F0 RA0b SA0 F0b SA0b RG0b B0b SG0b RG0 B0 STEP", good[1]});
    EXPECT_FAULT(&s, 1, 0, 1, "deadlock");
    CHECK(strstr(gp_last_error(), "stage 0 at action 1 RECV_ACT(0, chunk 1) waits for stage 1") !=
          NULL);
    gp_schedule_free(&s);
}

/* Hand-broken split backwards: each rule of the validator names the action. */
static void test_broken_split(void) {
    gp_schedule s = {0};
    build(&s, 1, 2, (const char *const[]){"F0 F1 W0 BI0 BI1 W1 STEP"});
    EXPECT_FAULT(&s, 1, 0, 2, "BACKWARD_WEIGHT(0): comes before BACKWARD_INPUT(0)");
    gp_schedule_free(&s);
    build(&s, 1, 2, (const char *const[]){"F0 F1 BI0 BI1 W1 W0 STEP"});
    EXPECT_FAULT(&s, 1, 0, 4, "weight gradients must run in micro-batch order");
    gp_schedule_free(&s);
    build(&s, 1, 2, (const char *const[]){"F0 F1 BI0 B0 BI1 W0 W1 STEP"});
    EXPECT_FAULT(&s, 1, 0, 3, "already had BACKWARD_INPUT at action 2");
    gp_schedule_free(&s);
    build(&s, 1, 2, (const char *const[]){"F0 F1 BI0 W0 BI1 STEP"});
    EXPECT_FAULT(&s, 1, 0, 5, "comes before BACKWARD_WEIGHT(1), which is missing");
    gp_schedule_free(&s);
    build(&s, 2, 1, (const char *const[]){"F0 SA0 RG0 BI0 W0 STEP", "RA0 F0 SG0 BI0 W0 STEP"});
    EXPECT_FAULT(&s, 1, 1, 2, "SEND_GRAD(0): comes before BACKWARD(0), which produces it");
    gp_schedule_free(&s);
    /* a whole backward on one stage and split ones on the other is fine */
    build(&s, 2, 1, (const char *const[]){"F0 SA0 RG0 B0 STEP", "RA0 F0 BI0 SG0 W0 STEP"});
    CHECK_OK(gp_schedule_validate(&s, 1, NULL));
    char text[256];
    gp_schedule_stage_str(&s, 1, text, sizeof text);
    CHECK(strcmp(text, "RA0 F0 BI0 SG0 W0 STEP") == 0);
    gp_schedule_free(&s);
}

/* Stages sharing devices that run one stage at a time: the step is at least the busiest device's
 * stages' busy times together (stage k on device k mod units). */
static void test_shared_step(void) {
    const gp_sim_stage st[4] = {{.busy = 1}, {.busy = 2}, {.busy = 3}, {.busy = 4}};
    CHECK(gp_sim_shared_step(st, 4, 1, 5.0) == 10.0); /* all on one */
    CHECK(gp_sim_shared_step(st, 4, 2, 5.0) == 6.0);  /* {1, 3} and {2, 4} */
    CHECK(gp_sim_shared_step(st, 4, 2, 7.5) == 7.5);  /* the replay's step is longer */
    CHECK(gp_sim_shared_step(st, 4, 3, 0.0) == 5.0);  /* {1, 4}, {2}, {3} */
    CHECK(gp_sim_shared_step(st, 4, 4, 5.0) == 5.0);  /* a device each */
    CHECK(gp_sim_shared_step(st, 4, 0, 5.0) == 5.0);  /* not known */
}

int main(void) {
    test_shared_step();
    test_stash_profiles();
    test_zbh1();
    test_broken_split();
    test_interleaved();
    test_broken_interleaved();
    test_zbv();
    test_generators_valid();
    test_printer();
    test_broken();
    test_bubble_and_memory();
    test_hand_computed();
    return gp_test_finish("test_schedule");
}
