/* numa: topology queries, node/core selection on synthetic topologies
 * (exact nodes, disjoint cores), binding on this machine, the report. */
#include "pd_test.h"

#include "cache/numa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 2 packages x 2 NUMA nodes x 4 cores: node k owns PUs 4k..4k+3. */
#define TWO_BY_TWO "pack:2 numa:2 core:4 pu:1"

static numa_topo *synth(const char *desc)
{
    numa_topo *t = NULL;
    pd_err err = {0};
    ck_assert_msg(numa_topo_synthetic(desc, &t, &err) == PD_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(t);
    return t;
}

static numa_choice pick(const numa_topo *t, const char *binding, unsigned rank, unsigned count)
{
    numa_choice c;
    pd_err err = {0};
    ck_assert_msg(numa_select(t, binding, rank, count, &c, &err) == PD_OK, "rank %u of %u: %s",
                  rank, count, err.msg);
    numa_choice_check(t, &c);
    ck_assert(!c.applied && !c.unsupported);
    return c;
}

/* Parses a cpu list of small numbers into a bit mask (test-side oracle). */
static unsigned long long mask_of(const char *list)
{
    unsigned long long m = 0;
    const char *p = list;
    while (*p) {
        char *end;
        unsigned long lo = strtoul(p, &end, 10), hi = lo;
        if (*end == '-')
            hi = strtoul(end + 1, &end, 10);
        ck_assert_uint_lt(hi, 64);
        for (unsigned long i = lo; i <= hi; i++)
            m |= 1ull << i;
        p = *end == ',' ? end + 1 : end;
    }
    return m;
}

START_TEST(numa_synthetic_topology_counts_nodes_and_pus)
{
    numa_topo *t = synth(TWO_BY_TWO);
    ck_assert(!numa_topo_is_this_system(t));
    ck_assert_uint_eq(numa_topo_nodes(t), 4);
    for (unsigned n = 0; n < 4; n++) {
        ck_assert_uint_eq(numa_topo_node_pus(t, n), 4);
        ck_assert_int_eq(numa_topo_node_os(t, n), (int)n);
    }
    ck_assert_uint_eq(numa_topo_node_pus(t, 4), 0);
    ck_assert_int_eq(numa_topo_node_os(t, 4), -1);
    ck_assert_ptr_nonnull(numa_topo_hwloc(t));
    numa_topo_free(t);
    numa_topo_free(NULL);
}
END_TEST

START_TEST(numa_bad_synthetic_description_is_a_format_error)
{
    numa_topo *t = (numa_topo *)&t; /* sentinel: must stay untouched */
    numa_topo *const before = t;
    pd_err err = {0};
    ck_assert_int_eq(numa_topo_synthetic("pack:x numa:2", &t, &err), PD_ERR_FORMAT);
    ck_assert_ptr_eq(t, before);
    ck_assert_ptr_nonnull(strstr(err.msg, "pack:x numa:2"));
    pd_err_clear(&err);
    ck_assert_int_eq(numa_topo_synthetic(NULL, &t, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(t, before);
}
END_TEST

START_TEST(numa_xml_export_round_trips_the_topology)
{
    char path[] = "/tmp/pd_numa_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    numa_topo *t = synth("numa:3 core:2 pu:2"), *x = NULL;
    pd_err err = {0};
    ck_assert_msg(numa_topo_export_xml(t, path, &err) == PD_OK, "%s", err.msg);
    ck_assert_msg(numa_topo_xml(path, &x, &err) == PD_OK, "%s", err.msg);
    ck_assert(!numa_topo_is_this_system(x));
    ck_assert_uint_eq(numa_topo_nodes(x), 3);
    ck_assert_uint_eq(numa_topo_node_pus(x, 2), 4);
    numa_choice c = pick(x, NULL, 2, 3);
    ck_assert_uint_eq(c.node, 2);
    ck_assert_str_eq(c.cpus, "8-11");
    numa_topo_free(x);
    numa_topo_free(t);
    unlink(path);

    numa_topo *missing = NULL;
    ck_assert_int_ne(numa_topo_xml("/nonexistent/pd_topology.xml", &missing, &err), PD_OK);
    ck_assert_ptr_null(missing);
}
END_TEST

START_TEST(numa_binding_nodes_lists_the_nodes_a_binding_touches)
{
    numa_topo *t = synth(TWO_BY_TWO);
    unsigned nodes[4], n = 0;
    pd_err err = {0};
    ck_assert_int_eq(numa_binding_nodes(t, "4-11", nodes, 4, &n, &err), PD_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(nodes[0], 1);
    ck_assert_uint_eq(nodes[1], 2);
    ck_assert_int_eq(numa_binding_nodes(t, "3,12", nodes, 4, &n, &err), PD_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(nodes[0], 0);
    ck_assert_uint_eq(nodes[1], 3);
    ck_assert_int_eq(numa_binding_nodes(t, "0-15", nodes, 1, &n, &err), PD_OK);
    ck_assert_uint_eq(n, 4); /* full count, only cap written */
    ck_assert_uint_eq(nodes[0], 0);
    ck_assert_int_eq(numa_binding_nodes(t, "5-6", nodes, 4, &n, &err), PD_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(nodes[0], 1);

    const char *malformed[] = {"5x", "3-1", "", ",1", "1,", "a", "1--2", "99999999"};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        pd_err e = {0};
        n = 77;
        ck_assert_msg(numa_binding_nodes(t, malformed[i], nodes, 4, &n, &e) == PD_ERR_FORMAT,
                      "\"%s\" accepted", malformed[i]);
        ck_assert_uint_eq(n, 77);
        ck_assert_ptr_nonnull(strstr(e.msg, "offset"));
    }
    pd_err_clear(&err);
    ck_assert_int_eq(numa_binding_nodes(t, "16-40", nodes, 4, &n, &err), PD_ERR_RANGE);
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_on_one_node_gives_each_rank_its_own_cores)
{
    numa_topo *t = synth("pack:1 numa:1 core:4 pu:2"); /* PUs 2c, 2c+1 on core c */
    numa_choice one = pick(t, NULL, 0, 1);
    ck_assert_int_eq(one.mode, NUMA_MODE_SPREAD);
    ck_assert_uint_eq(one.node, 0);
    ck_assert_str_eq(one.cpus, "0-7");
    ck_assert_str_eq(one.binding, "0-7");

    const char *two[] = {"0-3", "4-7"};
    const char *three[] = {"0-1", "2-3", "4-7"};
    for (unsigned r = 0; r < 2; r++) {
        numa_choice c = pick(t, "0-7", r, 2);
        ck_assert_int_eq(c.mode, NUMA_MODE_SPREAD);
        ck_assert_str_eq(c.cpus, two[r]);
        ck_assert_uint_eq(c.slot, r);
        ck_assert_uint_eq(c.ranks_on_node, 2);
        ck_assert(!c.cores_shared);
    }
    for (unsigned r = 0; r < 3; r++)
        ck_assert_str_eq(pick(t, NULL, r, 3).cpus, three[r]);

    /* 5 ranks, 4 cores: each rank one core, rank 0 and 1 share core 0. */
    const char *five[] = {"0-1", "0-1", "2-3", "4-5", "6-7"};
    for (unsigned r = 0; r < 5; r++) {
        numa_choice c = pick(t, NULL, r, 5);
        ck_assert_str_eq(c.cpus, five[r]);
        ck_assert(c.cores_shared);
    }
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_spreads_1_to_8_ranks_blocked_over_2_packages_of_2_nodes)
{
    numa_topo *t = synth(TWO_BY_TWO);
    /* expected node per rank: floor(r * 4 / count) */
    static const unsigned want_node[9][8] = {
        [1] = {0},
        [2] = {0, 2},
        [3] = {0, 1, 2},
        [4] = {0, 1, 2, 3},
        [5] = {0, 0, 1, 2, 3},
        [6] = {0, 0, 1, 2, 2, 3},
        [7] = {0, 0, 1, 1, 2, 2, 3},
        [8] = {0, 0, 1, 1, 2, 2, 3, 3},
    };
    static const char *const want_cpus[9][8] = {
        [1] = {"0-3"},
        [2] = {"0-3", "8-11"},
        [3] = {"0-3", "4-7", "8-11"},
        [4] = {"0-3", "4-7", "8-11", "12-15"},
        [5] = {"0-1", "2-3", "4-7", "8-11", "12-15"},
        [6] = {"0-1", "2-3", "4-7", "8-9", "10-11", "12-15"},
        [7] = {"0-1", "2-3", "4-5", "6-7", "8-9", "10-11", "12-15"},
        [8] = {"0-1", "2-3", "4-5", "6-7", "8-9", "10-11", "12-13", "14-15"},
    };
    for (unsigned count = 1; count <= 8; count++) {
        unsigned long long seen = 0, per_node[4] = {0};
        unsigned ranks[4] = {0};
        for (unsigned r = 0; r < count; r++) {
            numa_choice c = pick(t, "0-15", r, count);
            ck_assert_int_eq(c.mode, NUMA_MODE_SPREAD);
            ck_assert_uint_eq(c.nodes, 4);
            ck_assert_msg(c.node == want_node[count][r], "%u ranks: rank %u on node %u",
                          count, r, c.node);
            ck_assert_int_eq(c.node_os, (int)c.node);
            ck_assert_str_eq(c.cpus, want_cpus[count][r]);
            ck_assert(!c.cores_shared);
            unsigned long long m = mask_of(c.cpus);
            ck_assert_msg((seen & m) == 0, "%u ranks: rank %u overlaps", count, r);
            seen |= m;
            per_node[c.node] |= m;
            ranks[c.node]++;
            ck_assert_uint_eq(c.slot + 1, ranks[c.node]);
        }
        for (unsigned n = 0; n < 4; n++) {
            /* even: floor or ceil of count/4 ranks per node */
            ck_assert_uint_ge(ranks[n], count / 4);
            ck_assert_uint_le(ranks[n], (count + 3) / 4);
            /* a node with ranks hands out all of its cores */
            if (ranks[n])
                ck_assert_uint_eq(per_node[n], 0xfull << (4 * n));
        }
    }
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_respects_an_external_binding_to_one_node)
{
    numa_topo *t = synth(TWO_BY_TWO);
    for (unsigned r = 0; r < 4; r++) {
        numa_choice c = pick(t, "4-7", r, 4);
        ck_assert_int_eq(c.mode, NUMA_MODE_RESPECTED);
        ck_assert(c.respected);
        ck_assert_uint_eq(c.node, 1);
        ck_assert_str_eq(c.cpus, "4-7");
        ck_assert_str_eq(c.binding, "4-7");
        ck_assert_uint_eq(c.nodes, 1);
    }
    numa_choice core = pick(t, "13", 0, 2); /* --bind-to core */
    ck_assert(core.respected);
    ck_assert_uint_eq(core.node, 3);
    ck_assert_str_eq(core.cpus, "13");

    /* respected means not re-bound, even when asked to bind */
    pd_err err = {0};
    ck_assert_int_eq(numa_apply(t, &core, 0, &err), PD_OK);
    ck_assert(!core.applied && !core.unsupported);
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_share_node_gives_every_rank_on_a_node_all_its_cpus)
{
    numa_topo *t = synth(TWO_BY_TWO);
    pd_err err = {0};
    /* 4 ranks over 2 of 4 nodes: two ranks per node share its 4 cpus */
    const char *want[] = {"4-7", "4-7", "8-11", "8-11"};
    for (unsigned r = 0; r < 4; r++) {
        numa_choice c = pick(t, "4-11", r, 4);
        ck_assert_int_eq(numa_share_node(t, &c, &err), PD_OK);
        numa_choice_check(t, &c);
        ck_assert(c.node_shared);
        ck_assert_str_eq(c.cpus, want[r]);
        ck_assert_uint_eq(c.n_cpus, 4);
        ck_assert_uint_eq(c.ranks_on_node, 2);
    }
    /* within a binding that covers part of a node: that part only */
    numa_choice part = pick(t, "4-5,8-11", 0, 2);
    ck_assert_int_eq(numa_share_node(t, &part, &err), PD_OK);
    ck_assert_str_eq(part.cpus, "4-5");
    ck_assert_uint_eq(part.n_cpus, 2);
    /* an external binding is kept */
    numa_choice core = pick(t, "13", 0, 2);
    ck_assert_int_eq(numa_share_node(t, &core, &err), PD_OK);
    ck_assert(!core.node_shared);
    ck_assert_str_eq(core.cpus, "13");
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_chooses_within_a_binding_spanning_2_of_4_nodes)
{
    numa_topo *t = synth(TWO_BY_TWO);
    const char *two[] = {"4-7", "8-11"};
    const unsigned two_node[] = {1, 2};
    for (unsigned r = 0; r < 2; r++) {
        numa_choice c = pick(t, "4-11", r, 2);
        ck_assert_int_eq(c.mode, NUMA_MODE_WITHIN);
        ck_assert_uint_eq(c.nodes, 2);
        ck_assert_uint_eq(c.node, two_node[r]);
        ck_assert_str_eq(c.cpus, two[r]);
    }
    const char *three[] = {"4-5", "6-7", "8-11"};
    const char *four[] = {"4-5", "6-7", "8-9", "10-11"};
    unsigned long long seen = 0;
    for (unsigned r = 0; r < 3; r++)
        ck_assert_str_eq(pick(t, "4-11", r, 3).cpus, three[r]);
    for (unsigned r = 0; r < 4; r++) {
        numa_choice c = pick(t, "4-11", r, 4);
        ck_assert_str_eq(c.cpus, four[r]);
        ck_assert_uint_eq(c.node, r < 2 ? 1 : 2);
        ck_assert((seen & mask_of(c.cpus)) == 0);
        seen |= mask_of(c.cpus);
    }
    ck_assert_uint_eq(seen, 0xff0);

    /* Partial nodes: only the bound CPUs of each node are handed out. */
    const char *ragged[] = {"2-3", "4-7", "8-9"};
    for (unsigned r = 0; r < 3; r++) {
        numa_choice c = pick(t, "2-9", r, 3);
        ck_assert_int_eq(c.mode, NUMA_MODE_WITHIN);
        ck_assert_uint_eq(c.node, r);
        ck_assert_str_eq(c.cpus, ragged[r]);
    }
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_uses_pus_when_the_topology_has_no_cores)
{
    numa_topo *t = synth("numa:2 pu:4");
    const char *want[] = {"0-1", "2-3", "4-5", "6-7"};
    for (unsigned r = 0; r < 4; r++) {
        numa_choice c = pick(t, NULL, r, 4);
        ck_assert_uint_eq(c.node, r / 2);
        ck_assert_str_eq(c.cpus, want[r]);
    }
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_select_rejects_bad_ranks_and_bindings_without_touching_the_output)
{
    numa_topo *t = synth(TWO_BY_TWO);
    numa_choice c, before;
    memset(&c, 0x5a, sizeof c);
    before = c;
    pd_err err = {0};
    ck_assert_int_eq(numa_select(t, NULL, 0, 0, &c, &err), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "numa:"));
    pd_err_clear(&err);
    ck_assert_int_eq(numa_select(t, NULL, 4, 4, &c, &err), PD_ERR_ARG);
    pd_err_clear(&err);
    ck_assert_int_eq(numa_select(t, "0-3,x", 0, 1, &c, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "offset 4"));
    pd_err_clear(&err);
    ck_assert_int_eq(numa_select(t, "64-127", 0, 1, &c, &err), PD_ERR_RANGE);
    ck_assert_int_eq(memcmp(&c, &before, sizeof c), 0);
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_place_on_a_synthetic_topology_reports_binding_unsupported)
{
    numa_topo *t = synth(TWO_BY_TWO);
    numa_choice c;
    pd_err err = {0};
    ck_assert_msg(numa_place(t, 1, 2, 0, &c, &err) == PD_OK, "%s", err.msg);
    numa_choice_check(t, &c);
    /* hwloc reports a synthetic machine's binding as the whole machine */
    ck_assert_int_eq(c.mode, NUMA_MODE_SPREAD);
    ck_assert_uint_eq(c.node, 2);
    ck_assert_str_eq(c.cpus, "8-11");
    ck_assert(c.unsupported && !c.applied);
    ck_assert_ptr_nonnull(strstr(c.why, "synthetic"));

    ck_assert_int_eq(numa_place(t, 1, 2, NUMA_NO_BIND, &c, &err), PD_OK);
    ck_assert(!c.unsupported && !c.applied);

    /* 8 ranks, two per node: rank 1 holds cpus 2-3 of node 0, or with
     * NUMA_SHARE_NODE all four of them */
    ck_assert_int_eq(numa_place(t, 1, 8, NUMA_NO_BIND, &c, &err), PD_OK);
    ck_assert_str_eq(c.cpus, "2-3");
    ck_assert(!c.node_shared);
    ck_assert_int_eq(numa_place(t, 1, 8, NUMA_NO_BIND | NUMA_SHARE_NODE, &c, &err), PD_OK);
    numa_choice_check(t, &c);
    ck_assert_str_eq(c.cpus, "0-3");
    ck_assert(c.node_shared && c.n_cpus == 4 && c.ranks_on_node == 2);
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_place_on_this_machine_binds_and_the_binding_reads_back)
{
    numa_topo *t = NULL;
    pd_err err = {0};
    ck_assert_msg(numa_topo_load(&t, &err) == PD_OK, "%s", err.msg);
    ck_assert(numa_topo_is_this_system(t));
    unsigned count = 2;
    for (unsigned r = 0; r < count; r++) {
        numa_choice c;
        ck_assert_msg(numa_place(t, r, count, NUMA_THREAD, &c, &err) == PD_OK, "%s", err.msg);
        numa_choice_check(t, &c);
        ck_assert_msg(c.applied || c.respected, "rank %u: %s", r, c.why);
        char now[NUMA_CPUS_CHARS];
        ck_assert_int_eq(numa_binding_get(t, NUMA_THREAD, now, sizeof now, &err), PD_OK);
        ck_assert_str_eq(now, c.cpus);
        /* undo for the next rank: bind the thread back to the machine */
        numa_choice all = c;
        snprintf(all.cpus, sizeof all.cpus, "%s", c.binding);
        all.respected = false;
        all.applied = false;
        ck_assert_int_eq(numa_apply(t, &all, NUMA_THREAD, &err), PD_OK);
    }
    if (numa_topo_nodes(t) == 1) { /* this machine: one node, os index 0 */
        numa_choice c;
        ck_assert_int_eq(numa_select(t, NULL, 0, 1, &c, &err), PD_OK);
        ck_assert_uint_eq(c.node, 0);
        ck_assert_int_eq(c.node_os, 0);
    }
    numa_topo_free(t);
}
END_TEST

START_TEST(numa_report_formats_one_line_and_one_json_object)
{
    numa_topo *t = synth(TWO_BY_TWO);
    numa_choice c = pick(t, NULL, 3, 8);
    pd_err err = {0};
    ck_assert_int_eq(numa_apply(t, &c, 0, &err), PD_OK); /* synthetic: unsupported */
    numa_report_info info = {.rank = 11, .host = "node\"7", .bytes_placed = 1052672,
                             .verified = true, .placement = "bound to numa node 1 (os 1)"};
    char line[NUMA_REPORT_CHARS], json[NUMA_REPORT_CHARS];
    ck_assert_int_eq(numa_report_line(&c, &info, line, sizeof line, &err), PD_OK);
    ck_assert_str_eq(line, "rank 11 on node\"7: numa node 1 (os 1) of 4, cpus 6-7, spread (2 of 2 "
                           "ranks on the node), binding unsupported (topology is synthetic or "
                           "from XML, binding is a no-op); 1052672 bytes placed (bound to numa "
                           "node 1 (os 1)), verified yes");
    ck_assert_int_eq(numa_report_json(&c, &info, json, sizeof json, &err), PD_OK);
    ck_assert_str_eq(json, "{\"rank\":11,\"host\":\"node\\\"7\",\"node\":1,\"node_os\":1,"
                           "\"cpuset\":\"6-7\",\"mode\":\"spread\",\"binding\":\"unsupported "
                           "(topology is synthetic or from XML, binding is a no-op)\","
                           "\"bytes_placed\":1052672,\"verified\":true,"
                           "\"placement\":\"bound to numa node 1 (os 1)\"}");

    numa_choice r = pick(t, "12-15", 0, 1);
    numa_report_info plain = {.rank = 0, .host = NULL, .bytes_placed = 0, .verified = false};
    ck_assert_int_eq(numa_report_json(&r, &plain, json, sizeof json, &err), PD_OK);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char want[512];
    snprintf(want, sizeof want,
             "{\"rank\":0,\"host\":\"%s\",\"node\":3,\"node_os\":3,\"cpuset\":\"12-15\","
             "\"mode\":\"respected\",\"binding\":\"respected\",\"bytes_placed\":0,"
             "\"verified\":false}",
             host);
    ck_assert_str_eq(json, want);

    char tiny[40];
    ck_assert_int_eq(numa_report_line(&c, &info, tiny, sizeof tiny, &err), PD_ERR_RANGE);
    pd_err_clear(&err);
    ck_assert_int_eq(numa_report_json(&c, &info, tiny, sizeof tiny, &err), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "40"));
    numa_topo_free(t);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("numa");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, numa_synthetic_topology_counts_nodes_and_pus);
    tcase_add_test(tc, numa_bad_synthetic_description_is_a_format_error);
    tcase_add_test(tc, numa_xml_export_round_trips_the_topology);
    tcase_add_test(tc, numa_binding_nodes_lists_the_nodes_a_binding_touches);
    tcase_add_test(tc, numa_select_on_one_node_gives_each_rank_its_own_cores);
    tcase_add_test(tc, numa_select_spreads_1_to_8_ranks_blocked_over_2_packages_of_2_nodes);
    tcase_add_test(tc, numa_select_respects_an_external_binding_to_one_node);
    tcase_add_test(tc, numa_select_chooses_within_a_binding_spanning_2_of_4_nodes);
    tcase_add_test(tc, numa_share_node_gives_every_rank_on_a_node_all_its_cpus);
    tcase_add_test(tc, numa_select_uses_pus_when_the_topology_has_no_cores);
    tcase_add_test(tc, numa_select_rejects_bad_ranks_and_bindings_without_touching_the_output);
    tcase_add_test(tc, numa_place_on_a_synthetic_topology_reports_binding_unsupported);
    tcase_add_test(tc, numa_place_on_this_machine_binds_and_the_binding_reads_back);
    tcase_add_test(tc, numa_report_formats_one_line_and_one_json_object);
    suite_add_tcase(s, tc);
    return s;
}
