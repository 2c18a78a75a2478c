(* Every main theorem must print "Closed under the global context": its
   proof depends on nothing but the definitions of Coq and MathComp. *)

From SpecSample Require Import OneToken SeqSum Block AcceptLength BlockVerify Tree.

(* One-token lemma *)
Print Assumptions one_token.
Print Assumptions one_token_min_form.
Print Assumptions acc_mass.
Print Assumptions acc_qpos.
Print Assumptions rej_eq.
Print Assumptions sum_resid.
Print Assumptions beta1_eq.
Print Assumptions beta1_rej0.
Print Assumptions beta1_res0.
Print Assumptions strict_rule.
Print Assumptions strict_rule_never_p0.
Print Assumptions out_tv.

(* Block theorem and composition *)
Print Assumptions block_theorem.
Print Assumptions round_AR.
Print Assumptions rounds_AR.
Print Assumptions speculative_prefix.
Print Assumptions eager_round.
Print Assumptions round_chunk.
Print Assumptions chunk_complete.
Print Assumptions chunk_mass.
Print Assumptions block_deterministic_draft.
Print Assumptions block_greedy.

(* Accepted-length law *)
Print Assumptions accepted_length.
Print Assumptions accepted_length_sum1.
Print Assumptions expected_tokens.
Print Assumptions accepted_length_context_free.
Print Assumptions lawN_sum1.
Print Assumptions lawN_mean.
Print Assumptions lawN_mean_closed.
Print Assumptions speedup_closed.

(* Block verification (Sun et al. 2025) *)
Print Assumptions roundB_AR.
Print Assumptions roundsB_AR.
Print Assumptions block_speculative_prefix.
Print Assumptions block_verification_complete.
Print Assumptions F_complete.
Print Assumptions sum_none.
Print Assumptions hB_range.
Print Assumptions first_accepted.

(* Tree verification: one level of recursive rejection sampling *)
Print Assumptions rrs_level.
Print Assumptions rrs_iid.
Print Assumptions rrs_candidates.
