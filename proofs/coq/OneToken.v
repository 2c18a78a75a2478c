(* One-token lemma of speculative sampling.
   Notation: p = target distribution, q = draft distribution (Leviathan et al.
   2023).  Both are the warped distributions (after temperature, top-k, top-p,
   min-p) over a finite vocabulary T; q is the law the draft token was
   actually sampled from.  All statements hold over any real field R. *)

From mathcomp Require Import all_ssreflect all_algebra.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.TTheory.
Local Open Scope ring_scope.

Section OneToken.

Variable R : realFieldType.
Variable T : finType.
Variables p q : T -> R.

Hypothesis p_ge0 : forall x, 0 <= p x.
Hypothesis q_ge0 : forall x, 0 <= q x.
Hypothesis p_sum1 : \sum_x p x = 1.
Hypothesis q_sum1 : \sum_x q x = 1.

(* Probability that the implementation accepts a proposed token x, i.e. the
   Lebesgue measure of { u in [0,1) | u * q x < p x } (see strict_rule). *)
Definition acc x : R :=
  if q x == 0 then (if 0 < p x then 1 else 0) else Num.min 1 (p x / q x).

(* Acceptance rate beta = sum_x min(p x, q x). *)
Definition beta : R := \sum_x Num.min (p x) (q x).

(* Unnormalised residual max(0, p - q). *)
Definition res x : R := Num.max 0 (p x - q x).

(* Probability of a rejection: sum_x q x * (1 - acc x). *)
Definition rej : R := \sum_x q x * (1 - acc x).

(* Residual distribution; when beta = 1 there is no residual mass and the
   implementation falls back to a distribution f (it uses f = p). *)
Definition resid (f : T -> R) x : R :=
  if beta == 1 then f x else res x / (1 - beta).

(* Output law of one verification step when the residual is replaced by an
   arbitrary r'. *)
Definition out (r' : T -> R) y : R := q y * acc y + rej * r' y.

(* --- the strict, division-free rule: accept iff u * q x < p x ---------- *)

Lemma strict_rule_never_p0 x u : 0 <= u -> p x = 0 -> ~~ (u * q x < p x).
Proof. by move=> u0 ->; rewrite -leNgt mulr_ge0. Qed.

Lemma strict_rule_q0 x u : 0 <= u < 1 -> q x = 0 ->
  (u * q x < p x) = (u < acc x).
Proof.
case/andP=> u0 u1 qx0; rewrite /acc qx0 eqxx mulr0.
by case: (ltrP 0 (p x)) => _ /=; rewrite ?u1 // ltNge u0.
Qed.

Lemma strict_rule_qpos x u : 0 <= u < 1 -> 0 < q x ->
  (u * q x < p x) = (u < acc x).
Proof.
case/andP=> u0 u1 qx0; rewrite /acc gt_eqF // lt_minr u1 /=.
by rewrite ltr_pdivl_mulr.
Qed.

(* For u uniform on [0,1): the accepted set is exactly [0, acc x). *)
Theorem strict_rule x u : 0 <= u < 1 -> (u * q x < p x) = (u < acc x).
Proof.
move=> hu; case: (ltrgt0P (q x)) => hq.
- exact: strict_rule_qpos.
- by move: (q_ge0 x); rewrite leNgt hq.
- exact: strict_rule_q0.
Qed.

Lemma acc_qpos x : 0 < q x -> acc x = Num.min 1 (p x / q x).
Proof. by move=> h; rewrite /acc gt_eqF. Qed.

Lemma acc_ge0 x : 0 <= acc x.
Proof.
rewrite /acc; case: eqP => _; first by case: (0 < p x).
by rewrite le_minr ler01 divr_ge0.
Qed.

Lemma acc_le1 x : acc x <= 1.
Proof.
rewrite /acc; case: eqP => _; first by case: (0 < p x); rewrite ?ler01.
by rewrite le_minl lexx.
Qed.

(* --- masses -------------------------------------------------------------- *)

(* Accept mass of y: q y * min(1, p y / q y) = min(p y, q y). *)
Lemma acc_mass y : q y * acc y = Num.min (p y) (q y).
Proof.
rewrite /acc; case: eqP => [->|/eqP qy0].
  by rewrite mul0r min_r.
rewrite minr_pmulr // mulr1 mulrCA mulfV // mulr1.
by rewrite minC.
Qed.

Lemma min_add_res y : Num.min (p y) (q y) + res y = p y.
Proof.
rewrite /res; case: (lerP (p y) (q y)) => h.
  by rewrite max_l ?addr0 // subr_le0.
by rewrite max_r ?subr_ge0 ?(ltW h) // addrC subrK.
Qed.

Lemma res_ge0 y : 0 <= res y.
Proof. by rewrite /res le_maxr lexx. Qed.

Lemma beta_ge0 : 0 <= beta.
Proof. by apply: sumr_ge0 => x _; rewrite le_minr p_ge0 q_ge0. Qed.

Lemma beta_le1 : beta <= 1.
Proof.
rewrite -q_sum1; apply: ler_sum => x _.
by rewrite le_minl lexx orbT.
Qed.

Lemma sum_res : \sum_x res x = 1 - beta.
Proof.
apply/eqP; rewrite eq_sym subr_eq addrC /beta -big_split /= -p_sum1.
by apply/eqP/eq_bigr => x _; rewrite min_add_res.
Qed.

Lemma sum_acc_mass : \sum_x q x * acc x = beta.
Proof. by apply: eq_bigr => x _; rewrite acc_mass. Qed.

Lemma rej_eq : rej = 1 - beta.
Proof.
rewrite /rej (eq_bigr (fun x => q x - q x * acc x)); last first.
  by move=> x _; rewrite mulrBr mulr1.
by rewrite sumrB q_sum1 sum_acc_mass.
Qed.

(* beta = 1: rejection is impossible, the residual is identically 0, p = q. *)
Lemma beta1_res0 : beta = 1 -> forall y, res y = 0.
Proof.
move=> b1 y; have: \sum_x res x = 0 by rewrite sum_res b1 subrr.
by move/psumr_eq0P => -> // x _; exact: res_ge0.
Qed.

Lemma beta1_rej0 : beta = 1 -> rej = 0.
Proof. by move=> b1; rewrite rej_eq b1 subrr. Qed.

Lemma beta1_eq : beta = 1 -> forall y, p y = q y.
Proof.
move=> b1 y.
have hp : Num.min (p y) (q y) = p y by rewrite -[RHS]min_add_res beta1_res0 ?addr0.
have : \sum_x (q x - Num.min (p x) (q x)) = 0.
  by rewrite sumrB q_sum1 -/beta b1 subrr.
have hge : forall x, true -> 0 <= q x - Num.min (p x) (q x).
  by move=> x _; rewrite subr_ge0 le_minl lexx orbT.
move/psumr_eq0P => /(_ hge y isT) /eqP.
by rewrite subr_eq0 hp => /eqP.
Qed.

Lemma beta_ne1 : beta != 1 -> 1 - beta != 0.
Proof. by rewrite subr_eq0 eq_sym. Qed.

Lemma beta_ne1_lt1 : beta != 1 -> beta < 1.
Proof. by move=> h; rewrite lt_neqAle h beta_le1. Qed.

(* The residual is a probability distribution (given that the fallback is). *)
Lemma resid_ge0 f : (forall x, 0 <= f x) -> forall y, 0 <= resid f y.
Proof.
move=> f0 y; rewrite /resid; case: eqP => // /eqP h.
by rewrite divr_ge0 ?res_ge0 // subr_ge0 beta_le1.
Qed.

Lemma sum_resid f : \sum_x f x = 1 -> \sum_x resid f x = 1.
Proof.
move=> f1; rewrite /resid; have [h|h] := eqVneq beta 1.
  by rewrite (eq_bigr f).
by rewrite -mulr_suml sum_res divff // beta_ne1.
Qed.

(* ONE-TOKEN THEOREM.  The emitted token y has law
     q y * acc y  +  rej * resid f y  =  p y
   (accepted draft y, or rejection followed by a residual draw), for every
   fallback f, including the case beta = 1. *)
Theorem one_token f y : q y * acc y + rej * resid f y = p y.
Proof.
rewrite acc_mass rej_eq /resid; have [b1|hb] := eqVneq beta 1.
  by rewrite b1 subrr mul0r addr0 -[RHS]min_add_res beta1_res0 ?addr0.
by rewrite mulrC divfK ?beta_ne1 // min_add_res.
Qed.

(* Division-free form: min(p,q) + (1 - beta) * (max(0,p-q) / (1 - beta)) = p
   when beta < 1. *)
Theorem one_token_min_form y : beta < 1 ->
  Num.min (p y) (q y) + (1 - beta) * (res y / (1 - beta)) = p y.
Proof.
move=> hb; rewrite mulrC divfK ?min_add_res // beta_ne1 //.
by rewrite lt_eqF.
Qed.

(* --- numerics: replacing the residual by r' ----------------------------- *)

Lemma out_dev r' f y : out r' y - p y = (1 - beta) * (r' y - resid f y).
Proof.
rewrite -[in LHS](one_token f y) /out -rej_eq.
by rewrite opprD addrACA subrr add0r -mulrBr.
Qed.

(* Sum of absolute deviations (= 2 TV): the output law moves by exactly
   (1 - beta) times the distance between r' and the true residual. *)
Theorem out_tv r' f :
  \sum_y `|out r' y - p y| = (1 - beta) * \sum_y `|r' y - resid f y|.
Proof.
rewrite mulr_sumr; apply: eq_bigr => y _.
rewrite (out_dev r' f) normrM ger0_norm // subr_ge0; exact: beta_le1.
Qed.

End OneToken.
