(* Accepted-length law (Leviathan et al. 2023, Eq. 1 and Thm 3.8).

   The number n of accepted drafts in a round with K drafts satisfies
     P(n = i) = alpha^i (1 - alpha)  for i < K,     P(n = K) = alpha^K,
   the round emits n + 1 tokens, and
     (1 - alpha) E[n + 1] = 1 - alpha^(K+1).
   Assumption (the "i.i.d." assumption of Leviathan et al.): the acceptance
   rate beta(p c, q c) = sum_x min(p c x, q c x) is the same number alpha at
   every context c.  This holds in particular when p and q do not depend on
   the context.  The law is derived from the round model of Block.v: n + 1
   is the length of the emitted chunk. *)

From mathcomp Require Import all_ssreflect all_algebra.
From SpecSample Require Import OneToken SeqSum Block.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.TTheory.
Local Open Scope ring_scope.

(* --- closed forms (pure algebra) ------------------------------------------ *)

Section ClosedForm.

Variable R : realFieldType.
Variable alpha : R.

Definition lawN (K i : nat) : R :=
  if (i < K)%N then alpha ^+ i * (1 - alpha)
  else if i == K then alpha ^+ K else 0.

Lemma geom K : (1 - alpha) * (\sum_(i < K) alpha ^+ i) = 1 - alpha ^+ K.
Proof.
by rewrite -[1 - alpha]opprB mulNr -subrX1 opprB.
Qed.

Lemma lawN_split K (F : nat -> R) :
  \sum_(i < K.+1) F i * lawN K i
  = \sum_(i < K) F i * (alpha ^+ i * (1 - alpha)) + F K * alpha ^+ K.
Proof.
rewrite big_ord_recr /= /lawN ltnn eqxx; congr (_ + _).
by apply: eq_bigr => i _; rewrite ltn_ord.
Qed.

Theorem lawN_sum1 K : \sum_(i < K.+1) lawN K i = 1.
Proof.
rewrite (eq_bigr (fun i : 'I_K.+1 => 1 * lawN K i)) => [|i _]; last first.
  by rewrite mul1r.
rewrite (lawN_split K (fun _ => 1)) mul1r.
rewrite (eq_bigr (fun i : 'I_K => (1 - alpha) * alpha ^+ i)) => [|i _]; last first.
  by rewrite mul1r mulrC.
by rewrite -mulr_sumr geom subrK.
Qed.

(* E[n + 1] = 1 + alpha + ... + alpha^K. *)
Theorem lawN_mean K :
  \sum_(i < K.+1) (i.+1)%:R * lawN K i = \sum_(i < K.+1) alpha ^+ i.
Proof.
rewrite (lawN_split K (fun i => (i.+1)%:R)); elim: K => [|K IH].
  by rewrite !big_ord0 big_ord1 add0r mul1r.
rewrite big_ord_recr /= [in RHS]big_ord_recr /= -IH -!addrA; congr (_ + _).
rewrite mulrBr mulr1 -exprSr mulrBr [(K.+2)%:R]mulrSr mulrDl mul1r.
by rewrite addrA subrK.
Qed.

(* Leviathan et al. Eq. 1: (1 - alpha) E[tokens per round] = 1 - alpha^(K+1). *)
Theorem lawN_mean_closed K :
  (1 - alpha) * (\sum_(i < K.+1) (i.+1)%:R * lawN K i) = 1 - alpha ^+ K.+1.
Proof. by rewrite lawN_mean geom. Qed.

(* Expected walltime improvement factor (Leviathan et al. Thm 3.8): a round
   costs K c + 1 target-forward times (c = draft/target cost ratio). *)
Definition speedup K (cost : R) :=
  (\sum_(i < K.+1) (i.+1)%:R * lawN K i) / (K%:R * cost + 1).

Theorem speedup_closed K cost : alpha != 1 ->
  speedup K cost = (1 - alpha ^+ K.+1) / ((1 - alpha) * (K%:R * cost + 1)).
Proof.
move=> ha; rewrite /speedup -lawN_mean_closed -mulf_div divff ?mul1r //.
by rewrite subr_eq0 eq_sym.
Qed.

End ClosedForm.

(* --- the law of the round's length ---------------------------------------- *)

Section AcceptLength.

Variable R : realFieldType.
Variable T : finType.
Variables p q : seq T -> T -> R.

Hypothesis p_ge0 : forall c x, 0 <= p c x.
Hypothesis q_ge0 : forall c x, 0 <= q c x.
Hypothesis p_sum1 : forall c, \sum_x p c x = 1.
Hypothesis q_sum1 : forall c, \sum_x q c x = 1.

Variable alpha : R.
Hypothesis beta_const : forall c, beta (p c) (q c) = alpha.

(* P(n = i) = P(the round emits i + 1 tokens) = sum of the chunk law over
   sequences of length i + 1. *)
Theorem accepted_length K c i :
  sumlen i.+1 (chunk p q K c) = lawN alpha K i.
Proof.
elim: K c i => [|K IH] c [|i].
- by rewrite /= /lawN /= expr0; exact: p_sum1.
- by rewrite /lawN /=; apply: big1 => y _; apply: big1 => z _; exact: sumlen0.
- rewrite sumlen_chunkS // big1 => [|y _]; last by rewrite sumlen0_chunk mulr0.
  by rewrite add0r rejC_eq // beta_const /lawN /= expr0 mul1r.
rewrite sumlen_chunkS // addr0.
rewrite (eq_bigr (fun y => q c y * accC p q c y * lawN alpha K i)) => [|y _];
  last by rewrite IH.
rewrite -mulr_suml sum_acc_massC // beta_const /lawN ltnS eqSS.
case: ltnP => _; first by rewrite exprS mulrA.
by case: eqP => _; rewrite ?exprS ?mulr0.
Qed.

Theorem accepted_length_sum1 K c :
  \sum_(i < K.+1) sumlen i.+1 (chunk p q K c) = 1.
Proof.
by rewrite (eq_bigr (fun i : 'I_K.+1 => lawN alpha K i)) ?lawN_sum1 // => i _;
  rewrite accepted_length.
Qed.

(* Expected number of emitted tokens per round. *)
Theorem expected_tokens K c :
  (1 - alpha) * (\sum_(i < K.+1) (i.+1)%:R * sumlen i.+1 (chunk p q K c))
  = 1 - alpha ^+ K.+1.
Proof.
rewrite (eq_bigr (fun i : 'I_K.+1 => (i.+1)%:R * lawN alpha K i)) => [|i _].
  exact: lawN_mean_closed.
by rewrite accepted_length.
Qed.

End AcceptLength.

(* Context-free p and q satisfy the constant-acceptance assumption. *)
Corollary accepted_length_context_free (R : realFieldType) (T : finType)
    (p0 q0 : T -> R) :
  (forall x, 0 <= p0 x) -> (forall x, 0 <= q0 x) ->
  \sum_x p0 x = 1 -> \sum_x q0 x = 1 ->
  forall K (c : seq T) i,
    sumlen i.+1 (chunk (fun _ => p0) (fun _ => q0) K c)
    = lawN (beta p0 q0) K i.
Proof.
move=> p0_ge0 q0_ge0 p0_1 q0_1 K c i.
by apply: accepted_length.
Qed.
