(* Block theorem of speculative sampling, for context-dependent models.

   p c and q c are the target and draft distributions of the next token given
   the context (prefix) c : seq T.  A round with K drafts from context c:
   the draft proposes x_1 ~ q c, the target accepts it with probability
   acc (p c) (q c) x_1 (the strict rule u * q < p); on acceptance the round
   continues from context rcons c x_1 with K - 1 drafts; on rejection one
   token is drawn from the residual of (p c, q c) and the round ends; when
   all K drafts are accepted a bonus token is drawn from p at the extended
   context.  The next round starts from the emitted prefix (commit step).

   Laws are described by prefix probabilities: "law c s" is the probability
   that the generated stream, started from context c, begins with s.  These
   cylinder probabilities determine the law of every finite prefix. *)

From mathcomp Require Import all_ssreflect all_algebra.
From SpecSample Require Import OneToken SeqSum.

Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.TTheory.
Local Open Scope ring_scope.

Section Block.

Variable R : realFieldType.
Variable T : finType.
Variables p q : seq T -> T -> R.

Hypothesis p_ge0 : forall c x, 0 <= p c x.
Hypothesis q_ge0 : forall c x, 0 <= q c x.
Hypothesis p_sum1 : forall c, \sum_x p c x = 1.
Hypothesis q_sum1 : forall c, \sum_x q c x = 1.

Definition accC c x := acc (p c) (q c) x.
Definition rejC c := rej (p c) (q c).
(* The implementation's fallback when there is no residual mass is p. *)
Definition resC c x := resid (p c) (q c) (p c) x.

Lemma one_tokenC c y : q c y * accC c y + rejC c * resC c y = p c y.
Proof. exact: one_token. Qed.

Lemma sum_resC c : \sum_y resC c y = 1.
Proof. exact: sum_resid. Qed.

Lemma rejC_eq c : rejC c = 1 - beta (p c) (q c).
Proof. exact: rej_eq. Qed.

Lemma sum_acc_massC c : \sum_y q c y * accC c y = beta (p c) (q c).
Proof. exact: sum_acc_mass. Qed.

(* Autoregressive law of the target: probability that the stream from c
   starts with s is the product of the target's conditionals. *)
Fixpoint AR (c s : seq T) : R :=
  if s is y :: s' then p c y * AR (rcons c y) s' else 1.

(* --- the round (drafts sampled lazily) ------------------------------------
   round K cont c s: probability that the stream starts with s when one
   round with K drafts is run from c and, after the round, the stream is
   continued by the process whose prefix law is cont (at the new context). *)
Fixpoint round (K : nat) (cont : seq T -> seq T -> R) (c s : seq T)
    {struct K} : R :=
  match s with
  | [::] => 1
  | y :: s' =>
    match K with
    | 0 => p c y * cont (rcons c y) s'
    | K'.+1 => q c y * accC c y * round K' cont (rcons c y) s'
               + rejC c * resC c y * cont (rcons c y) s'
    end
  end.

(* BLOCK THEOREM: a round followed by target sampling is target sampling. *)
Theorem round_AR K cont : (forall c s, cont c s = AR c s) ->
  forall c s, round K cont c s = AR c s.
Proof.
move=> hc; elim: K => [|K IH] c [|y s] //=; first by rewrite hc.
by rewrite IH hc -mulrDl one_tokenC.
Qed.

Theorem block_theorem K c s : round K AR c s = AR c s.
Proof. exact: round_AR. Qed.

(* --- composition across rounds ------------------------------------------
   rounds [:: K1; ...; Km] cont: m rounds with K1, ..., Km drafts, each
   starting from the prefix emitted so far, then the continuation cont. *)
Fixpoint rounds (Ks : seq nat) (cont : seq T -> seq T -> R) :=
  if Ks is K :: Ks' then round K (rounds Ks' cont) else cont.

Theorem rounds_AR Ks c s : rounds Ks AR c s = AR c s.
Proof.
elim: Ks c s => [|K Ks IH] c s //=.
by apply: round_AR.
Qed.

(* Each round emits at least one token, so the first n+1 tokens of a round
   followed by cont only depend on cont through its first n tokens. *)
Lemma round_agree n K cont cont' :
  (forall c s, (size s <= n)%N -> cont c s = cont' c s) ->
  forall c s, (size s <= n.+1)%N -> round K cont c s = round K cont' c s.
Proof.
move=> hc; elim: K => [|K IH] c [|y s] //= hs; first by rewrite hc.
by rewrite IH ?hc // ltnW.
Qed.

Lemma rounds_agree Ks n cont cont' :
  (forall c s, (size s <= n)%N -> cont c s = cont' c s) ->
  forall c s, (size s <= size Ks + n)%N -> rounds Ks cont c s = rounds Ks cont' c s.
Proof.
elim: Ks n => [|K Ks IH] n hc c s //=; first exact: hc.
move=> hs; apply: (@round_agree (size Ks + n)) => //.
by move=> c' s' hs'; exact: (IH n hc c' s' hs').
Qed.

(* PURE SPECULATIVE GENERATION: m rounds (any K per round) produce at
   least m tokens, and the law of the first m tokens is the target's
   autoregressive law, whatever process follows the last round. *)
Theorem speculative_prefix Ks cont : (forall c, cont c [::] = 1) ->
  forall c s, (size s <= size Ks)%N -> rounds Ks cont c s = AR c s.
Proof.
move=> h1 c s hs; rewrite -(rounds_AR Ks c s).
apply: (@rounds_agree Ks 0) => [c' [|//] _|]; first by rewrite h1.
by rewrite addn0.
Qed.

(* --- eager drafting, as implemented ---------------------------------------
   The implementation samples all K drafts first (xs ~ Q c), then verifies
   them with K + 1 uniforms.  verify xs cont c s is the probability over
   the uniforms that the stream starts with s, given the drafts xs. *)
Fixpoint Q (c xs : seq T) : R :=
  if xs is x :: xs' then q c x * Q (rcons c x) xs' else 1.

Fixpoint verify (xs : seq T) (cont : seq T -> seq T -> R) (c s : seq T) : R :=
  match s with
  | [::] => 1
  | y :: s' =>
    match xs with
    | [::] => p c y * cont (rcons c y) s'
    | x :: xs' => (if x == y then accC c x * verify xs' cont (rcons c x) s'
                   else 0)
                  + (1 - accC c x) * resC c y * cont (rcons c y) s'
    end
  end.

Definition eager K cont c s := sumlen K (fun xs => Q c xs * verify xs cont c s).

Lemma sumQ K c : sumlen K (Q c) = 1.
Proof.
elim: K c => [|K IH] c //=.
rewrite -(q_sum1 c); apply: eq_bigr => x _.
by rewrite sumlenZ IH mulr1.
Qed.

(* Drafting lazily or eagerly gives the same law: the drafts after a
   rejection are sampled and discarded. *)
Theorem eager_round K cont c s : eager K cont c s = round K cont c s.
Proof.
rewrite /eager; elim: K c s => [|K IH] c [|y s] //=.
- by rewrite mul1r.
- by rewrite mul1r.
- transitivity (\sum_x q c x); last exact: q_sum1.
  apply: eq_bigr => x _.
  rewrite (@eq_sumlen _ _ K _ (fun t => q c x * Q (rcons c x) t)) => [|t].
    by rewrite sumlenZ sumQ mulr1.
  by rewrite mulr1.
have pt x : sumlen K (fun t => q c x * Q (rcons c x) t *
     ((if x == y then accC c x * verify t cont (rcons c x) s else 0)
      + (1 - accC c x) * resC c y * cont (rcons c y) s))
   = (if x == y then q c x * accC c x *
        sumlen K (fun t => Q (rcons c x) t * verify t cont (rcons c x) s)
      else 0)
     + q c x * (1 - accC c x) * resC c y * cont (rcons c y) s.
  rewrite (@eq_sumlen _ _ K _ (fun t =>
      (if x == y then q c x * accC c x else 0) *
          (Q (rcons c x) t * verify t cont (rcons c x) s)
      + (q c x * (1 - accC c x) * resC c y * cont (rcons c y) s) *
          Q (rcons c x) t)); last first.
    move=> t; rewrite mulrDr; congr (_ + _).
      case: (x == y); last by rewrite !mulr0 mul0r.
      by rewrite -!mulrA; congr (_ * _); rewrite mulrCA.
    by rewrite [RHS]mulrC -!mulrA mulrCA.
  rewrite sumlenD !sumlenZ sumQ mulr1; congr (_ + _).
  by case: (x == y); rewrite ?mul0r // mulrA.
rewrite (eq_bigr _ (fun x _ => pt x)) big_split /=.
rewrite -big_mkcond big_pred1_eq IH; congr (_ + _).
by rewrite -!mulr_suml.
Qed.

(* --- the emitted chunk ---------------------------------------------------
   chunk K c t: probability that the round with K drafts from c emits
   exactly the tokens t (accepted drafts, then the correction or bonus
   token); size t = (number of accepted drafts) + 1. *)
Fixpoint chunk (K : nat) (c t : seq T) {struct K} : R :=
  match K, t with
  | 0, [:: y] => p c y
  | 0, _ => 0
  | K'.+1, y :: t' => q c y * accC c y * chunk K' (rcons c y) t'
                      + (if t' is [::] then rejC c * resC c y else 0)
  | K'.+1, [::] => 0
  end.

Lemma chunk_nil K c : chunk K c [::] = 0.
Proof. by case: K. Qed.

(* The round is: emit a chunk, then continue from context c ++ chunk. *)
Theorem round_chunk K cont c s : (K < size s)%N ->
  round K cont c s =
  \sum_(j < K.+1) chunk K c (take j.+1 s) * cont (c ++ take j.+1 s) (drop j.+1 s).
Proof.
elim: K c s => [|K IH] c [|y s] //=.
  by move=> _; rewrite big_ord1 /= take0 drop0 cats1.
move=> hs; rewrite big_ord_recl /= take0 drop0 chunk_nil mulr0 add0r cats1.
rewrite addrC; congr (_ + _); rewrite IH // mulr_sumr.
apply: eq_bigr => j _; case: s hs => [//|z s] _ /=.
by rewrite addr0 mulrA cat_rcons.
Qed.

(* The emitted chunk, completed to K + 1 tokens by sampling from the
   target, has exactly the target's autoregressive law. *)
Corollary chunk_complete K c s : size s = K.+1 ->
  \sum_(j < K.+1) chunk K c (take j.+1 s) * AR (c ++ take j.+1 s) (drop j.+1 s)
  = AR c s.
Proof.
by move=> hs; rewrite -round_chunk ?hs // block_theorem.
Qed.

(* Law of the chunk's length: i + 1 tokens (i accepted drafts). *)
Lemma sumlen_chunkS K c i :
  sumlen i.+1 (chunk K.+1 c) =
  \sum_y q c y * accC c y * sumlen i (chunk K (rcons c y))
  + (if i is 0 then rejC c else 0).
Proof.
rewrite /= (eq_bigr (fun y => q c y * accC c y * sumlen i (chunk K (rcons c y))
                   + (if i is 0 then rejC c * resC c y else 0))).
  rewrite big_split /=; congr (_ + _); case: i => [|i] /=.
    by rewrite -mulr_sumr sum_resC mulr1.
  by rewrite big1.
move=> y _; rewrite sumlenD sumlenZ; congr (_ + _).
exact: sumlen_nil.
Qed.

Lemma sumlen0_chunk K c : sumlen 0 (chunk K c) = 0.
Proof. exact: chunk_nil. Qed.

(* The chunk law is a probability distribution over lengths 1 .. K+1. *)
Theorem chunk_mass K c : \sum_(i < K.+1) sumlen i.+1 (chunk K c) = 1.
Proof.
elim: K c => [|K IH] c.
  by rewrite big_ord1 /= big_mkcond -(p_sum1 c) /=; apply: eq_bigr.
rewrite big_ord_recl sumlen_chunkS.
have -> : \sum_y q c y * accC c y * sumlen 0 (chunk K (rcons c y)) = 0.
  by apply: big1 => y _; rewrite sumlen0_chunk mulr0.
rewrite add0r (eq_bigr (fun i : 'I_K.+1 => \sum_y q c y * accC c y *
            sumlen i.+1 (chunk K (rcons c y)))); last first.
  by move=> i _; rewrite sumlen_chunkS addr0.
rewrite exchange_big (eq_bigr (fun y => q c y * accC c y)); last first.
  by move=> y _; rewrite -mulr_sumr IH mulr1.
by rewrite sum_acc_massC rejC_eq subrK.
Qed.

End Block.

(* --- special cases -------------------------------------------------------- *)

Section SpecialCases.

Variable R : realFieldType.
Variable T : finType.

Definition onehot (d : T) : T -> R := fun x => (x == d)%:R.

Lemma onehot_ge0 d x : 0 <= onehot d x.
Proof. by rewrite /onehot ler0n. Qed.

Lemma onehot_sum1 d : \sum_x onehot d x = 1.
Proof.
rewrite (bigD1 d) //= /onehot eqxx big1 ?addr0 // => x /negbTE ->.
by [].
Qed.

(* Deterministic drafts (prompt lookup, argmax drafting): q c is the
   one-hot distribution at the proposed token d c. *)
Corollary block_deterministic_draft (p : seq T -> T -> R) (d : seq T -> T) :
  (forall c x, 0 <= p c x) -> (forall c, \sum_x p c x = 1) ->
  forall Ks c s,
    rounds p (fun c => onehot (d c)) Ks (AR p) c s = AR p c s.
Proof.
move=> p0 p1 Ks c s; apply: rounds_AR => //.
- by move=> c' x; exact: onehot_ge0.
- by move=> c'; exact: onehot_sum1.
Qed.

(* Greedy decoding (temperature 0): p c is one-hot at the argmax g c.  The
   target's law is then the point mass on the greedy continuation. *)
Fixpoint greedy (g : seq T -> T) (c : seq T) (n : nat) : seq T :=
  if n is n'.+1 then g c :: greedy g (rcons c (g c)) n' else [::].

Lemma AR_onehot (g : seq T -> T) c s :
  AR (fun c => onehot (g c)) c s = (s == greedy g c (size s))%:R.
Proof.
elim: s c => [|y s IH] c //=; rewrite IH eqseq_cons /onehot.
by case: eqP => [->|_] /=; rewrite ?mul1r ?mul0r.
Qed.

(* Speculative sampling with a greedy target, for any draft q (sampled or
   deterministic), emits the greedy continuation with probability 1. *)
Corollary block_greedy (g : seq T -> T) (q : seq T -> T -> R) :
  (forall c x, 0 <= q c x) -> (forall c, \sum_x q c x = 1) ->
  forall Ks c s,
    rounds (fun c => onehot (g c)) q Ks (AR (fun c => onehot (g c))) c s
    = (s == greedy g c (size s))%:R.
Proof.
move=> q0 q1 Ks c s; rewrite rounds_AR ?AR_onehot //.
- by move=> c' x; exact: onehot_ge0.
- by move=> c'; exact: onehot_sum1.
Qed.

End SpecialCases.
